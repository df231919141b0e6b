"""A create's and a quote's checks (jobs/requests.py), run off the event loop and bounded per
process.

The checks of a long source count its tokens (tiktoken, up to 400,000 characters: tens of
milliseconds) and plan its chunks; on the event loop that would stall every other request of
the process. They run instead on a small thread pool: tiktoken's encoder (Rust) releases the GIL
while it encodes, which is most of the work, so the loop keeps serving reads meanwhile
(measured in docs/benchmarks.md, "API fairness"). A thread rather than a process: the checks
need the catalog and policy objects as they are, and the GIL is not the bottleneck.

Only long inputs take the pool (INLINE_MAX_CHARS characters of text or more): a short input's
checks cost less than the hand-off, and they must not queue behind someone's long sources.
The bound is per process, by nature: `concurrency` checks at once (DEFAULT_CONCURRENCY), the
rest wait their turn in arrival order for at most `wait_s` (DEFAULT_WAIT_S) and are then
refused with 429 RATE_LIMITED (Retry-After 1), never a 5xx. Callers take the user's rate limit
first (jobs/rate_limit.py), so one user's burst is cut at its rate before it queues here.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from engine.errors import RateLimited
from jobs.requests import CreateJobRequest

T = TypeVar("T")
# A refused check is worth trying again as soon as a slot frees: the smallest whole second.
BUSY_RETRY_AFTER_S = 1
# One thread: the counting is CPU-bound and the API process has one core's worth of GIL-free
# encoding to give before it slows its own reads (docs/benchmarks.md, "API fairness").
DEFAULT_CONCURRENCY = 1
# Ten seconds of queueing is still a fast answer for a long source; past it a 429 tells the
# client to come back rather than hold its connection.
DEFAULT_WAIT_S = 10.0
# Below this many characters of text an input's checks take well under a millisecond (about
# 4,000 tokens to count): they run on the loop, and only long inputs take the pool.
INLINE_MAX_CHARS = 16_000


class CheckPool:
    """`concurrency` threads for the checks, with a FIFO wait of at most `wait_s` for one."""

    def __init__(self, concurrency: int = DEFAULT_CONCURRENCY, wait_s: float = DEFAULT_WAIT_S):
        if concurrency < 1 or wait_s <= 0:
            raise ValueError("the check pool needs at least one thread and a positive wait")
        self.concurrency = concurrency
        self.wait_s = wait_s
        self._executor = ThreadPoolExecutor(concurrency, thread_name_prefix="token-count")
        # The semaphore belongs to one event loop; a process that runs another (tests) gets a
        # fresh one there.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(concurrency)

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._slots = loop, asyncio.Semaphore(self.concurrency)
        return self._slots

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on a pool thread (with the caller's context: its trace span), once a
        slot is free; RateLimited when none frees within `wait_s`."""
        slots = self._semaphore()
        try:
            async with asyncio.timeout(self.wait_s):
                await slots.acquire()
        except TimeoutError:
            raise RateLimited(
                "This server is busy counting other requests' tokens; try again shortly.",
                retry_after_s=BUSY_RETRY_AFTER_S,
            ) from None
        try:
            ctx = contextvars.copy_context()
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, ctx.run, fn, *args
            )
        finally:
            slots.release()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


_pool = CheckPool()


def configure(*, concurrency: int, wait_s: float) -> CheckPool:
    """The process's pool with these bounds (the API sets them from its settings at start)."""
    global _pool
    if (concurrency, wait_s) != (_pool.concurrency, _pool.wait_s):
        old, _pool = _pool, CheckPool(concurrency, wait_s)
        old.shutdown()
    return _pool


def pool() -> CheckPool:
    return _pool


def text_chars(value: Any, depth: int = 0) -> int:
    """The characters of every string in a JSON value (keys included), to tell a long input
    from a short one cheaply: one `len` per string, never a scan of its text."""
    if isinstance(value, str):
        return len(value)
    if depth > 64:
        return 0
    if isinstance(value, dict):
        return sum(len(str(k)) + text_chars(v, depth + 1) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(text_chars(v, depth + 1) for v in value)
    return 0


async def off_loop(check: Callable[[CreateJobRequest], T], req: CreateJobRequest) -> T:
    """`check(req)`: on the process's check pool (see CheckPool.run) when the input holds
    INLINE_MAX_CHARS characters of text or more; a short input's check (well under a
    millisecond) runs at once on the loop, so short creates never queue behind long ones."""
    if text_chars(req.input) < INLINE_MAX_CHARS:
        return check(req)
    return await _pool.run(check, req)
