"""What a job's workflow and the limit waker share about a wait for a provider limit: the
signal that wakes a waiting run, and the backstop a concurrency wait never exceeds (no clock
predicts when a call ends; a lease whose worker was killed expires without a NOTIFY)."""

from __future__ import annotations

# The signal (no argument) the waker sends a run whose call may now fit (runtime/limit_waker.py).
LIMIT_WAKE_SIGNAL = "limit-wake"
# The longest a concurrency wait lasts without a wake-up; the waiter row counts a little longer.
LIMIT_WAIT_BACKSTOP_S = 60.0
