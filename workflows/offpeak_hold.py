"""An off-peak job's hold: the job stays `queued` on a durable timer, holding no worker slot and
polling nothing, until its provider's discount window opens (RESOLVE's `OffpeakHold`), or until
its deadline when that comes first. There its `offpeakDeadline` policy decides: `then:
"standard"` goes on at once (EXECUTE charges the standard price outside a window), `then:
"fail"` fails the job with OFFPEAK_DEADLINE_PASSED (non-retryable; the workflow finalizes it).

A cancel while it waits cancels the timer, and the job workflow finalizes it as cancelled. An
EXECUTE that finds the window closed (the job waited for a slot past it, or a retry came after
it) hands back the wait to the next window or the deadline (gate reason `offpeak`), which the job
workflow waits exactly (`wait_exactly`). Pure workflow code: timers and their arithmetic only.
"""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from engine.contracts import OffpeakHold
    from engine.errors import public_message_for
    from engine.offpeak import DEADLINE_PASSED, hold_until


async def hold(h: OffpeakHold) -> None:
    """Wait for the window, or for the deadline and then apply the job's policy there."""
    window_at = datetime.fromisoformat(h.window_at) if h.window_at else None
    until, at_deadline = hold_until(window_at, datetime.fromisoformat(h.deadline))
    wait_s = (until - workflow.now()).total_seconds()
    if wait_s > 0:
        await workflow.sleep(wait_s)
    if at_deadline and h.then != "standard":
        raise ApplicationError(
            public_message_for(DEADLINE_PASSED), type=DEADLINE_PASSED, non_retryable=True
        )


async def wait_exactly(wait_s: float) -> float:
    """EXECUTE's off-peak wait, as it is (no backoff, no jitter: a window opens on time);
    returns the wait left for the gate loop's own timer (none)."""
    await workflow.sleep(max(wait_s, 1.0))
    return 0.0
