"""The check pool: long inputs' checks run on a bounded pool off the loop, in arrival order; a
check that cannot get a thread within the wait is refused with 429 RATE_LIMITED, never failed;
short inputs' checks run at once."""

from __future__ import annotations

import asyncio
import threading

import pytest

from engine.errors import RateLimited
from jobs import token_count
from jobs.requests import CreateJobRequest
from jobs.token_count import INLINE_MAX_CHARS, CheckPool, text_chars


def request(text: str) -> CreateJobRequest:
    return CreateJobRequest("u", "quiz_generation", "lesson", "1", {"sourceText": text})


async def test_a_check_past_the_bound_waits_its_turn_then_is_refused() -> None:
    pool = CheckPool(concurrency=1, wait_s=0.3)
    holding, release = threading.Event(), threading.Event()

    def hold() -> str:
        holding.set()
        release.wait(10)
        return "first"

    first = asyncio.create_task(pool.run(hold))
    while not holding.is_set():
        await asyncio.sleep(0.01)
    # The only thread is busy: a second check waits its turn, a bounded time, then 429.
    with pytest.raises(RateLimited) as refused:
        await pool.run(lambda: "second")
    assert refused.value.http_status == 429 and refused.value.retry_after_s == 1
    # A waiter gets the thread as soon as it frees.
    waiter = asyncio.create_task(pool.run(lambda: "third"))
    await asyncio.sleep(0.05)
    release.set()
    assert await first == "first" and await waiter == "third"
    pool.shutdown()


async def test_short_inputs_are_checked_on_the_loop_and_long_ones_on_the_pool() -> None:
    threads: list[str] = []

    def check(req: CreateJobRequest) -> int:
        threads.append(threading.current_thread().name)
        return text_chars(req.input)

    short, long = "x" * (INLINE_MAX_CHARS - 100), "x" * INLINE_MAX_CHARS
    assert await token_count.off_loop(check, request(short)) < INLINE_MAX_CHARS
    assert await token_count.off_loop(check, request(long)) > INLINE_MAX_CHARS
    assert threads[0] == threading.current_thread().name
    assert threads[1].startswith("token-count")


def test_text_chars_counts_every_string_once() -> None:
    assert text_chars({"a": "xyz", "bb": ["q", {"c": "12"}, 5, None]}) == 1 + 3 + 2 + 1 + 1 + 2
