"""A job's wait for a provider limit, in its workflow: until the exact time room appears for it
(rpm, tpm, an announced reset: EXECUTE computed it from the waiters ahead of it in the key's
fair queue) or until a wake-up signal (the waker saw a call of its key end and the job at the
fair head), whichever comes first; a concurrency wait, which no clock predicts, waits until the
first lease in flight expires, at most LIMIT_WAIT_BACKSTOP_S (a lease whose worker was killed
expires and sends no NOTIFY).

`Wakes` counts the signals the run received; a wait compares with the count taken before its
EXECUTE began, so a wake-up that arrived while EXECUTE ran is not lost. A wake is per run: it
wakes every chunk of the run that waits (each looks again; the queue keeps their places)."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from engine.contracts import ExecuteResult
    from engine.limit_wait import LIMIT_WAIT_BACKSTOP_S

# Shorter waits are rounded up to this (a timer, not a busy loop).
MIN_WAIT_S = 0.1


class Wakes:
    """The limit wake-up signals this run received."""

    def __init__(self) -> None:
        self.count = 0

    def woken(self) -> None:
        self.count += 1


async def wait_for_room(wakes: Wakes, seen: int, executed: ExecuteResult, wait_s: float) -> float:
    """Until a wake-up newer than `seen`, or the wait's own end: `wait_s` (for `concurrency`,
    `executed.gate_reason`, the first lease's expiry, at most the backstop). Returns 0.0:
    nothing more to sleep."""
    if executed.gate_reason == "concurrency":  # a lease's expiry, at most the backstop
        wait_s = min(wait_s, LIMIT_WAIT_BACKSTOP_S)
    try:
        await workflow.wait_condition(lambda: wakes.count > seen, timeout=max(wait_s, MIN_WAIT_S))
    except TimeoutError:  # asyncio.TimeoutError: the wait's own end
        pass
    return 0.0
