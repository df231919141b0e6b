"""What provider admission answers when a call may not go now: ask again after a while.

Its own module so that the gate's callers (jobs/admission.py, the off-peak window of
jobs/offpeak.py, the limit queue of jobs/limit_wake.py) share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from db.provider_limits import LimitKey, Limits


@dataclass(frozen=True)
class Wait:
    """The key is paused, its breaker open or one of its limits used up (`reason`, as
    engine/contracts.py ExecuteResult.gate_reason names it): ask again after `wait_s`. A
    limit's wait names its `key`, `limits`, the call's `tokens`, its user and chunk: the
    caller puts it in the key's fair queue (jobs/limit_wake.py)."""

    wait_s: float
    reason: str
    provider: str
    model: str
    key: LimitKey | None = None
    limits: Limits | None = None
    tokens: int = 0
    user_id: str = ""
    chunk_no: int | None = None
    job_class: str | None = None  # interactive, background: its place in a reserved key
    job_type: str = ""  # an operator pause's hold names what it was held for (jobs/pauses.py)
