"""Lifecycle states and the only legal transitions between them.

The same table is enforced three times: here (code fails loudly), in the lifecycle repository
(every write is a compare-and-set on the expected state) and in a PostgreSQL trigger (even raw SQL
cannot break it).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args

# The states as a type, for response models and query filters; equal to LifecycleStatus's values.
StatusName = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class LifecycleStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL: frozenset[LifecycleStatus] = frozenset(
    {LifecycleStatus.SUCCEEDED, LifecycleStatus.FAILED, LifecycleStatus.CANCELLED}
)
# TERMINAL's values in declaration order (a stable SQL `IN (...)` list).
TERMINAL_VALUES: tuple[str, ...] = tuple(s.value for s in LifecycleStatus if s in TERMINAL)
ACTIVE_VALUES: tuple[str, ...] = tuple(s.value for s in LifecycleStatus if s not in TERMINAL)

if set(get_args(StatusName)) != {s.value for s in LifecycleStatus}:
    raise AssertionError("StatusName and LifecycleStatus disagree")

LEGAL_TRANSITIONS: frozenset[tuple[LifecycleStatus, LifecycleStatus]] = frozenset(
    {
        (LifecycleStatus.QUEUED, LifecycleStatus.RUNNING),
        (LifecycleStatus.QUEUED, LifecycleStatus.CANCELLED),
        (LifecycleStatus.RUNNING, LifecycleStatus.SUCCEEDED),
        (LifecycleStatus.RUNNING, LifecycleStatus.FAILED),
        (LifecycleStatus.RUNNING, LifecycleStatus.CANCELLED),
    }
)

# The legacy `status` column is shadow-written with this mapping.
LEGACY_STATUS: dict[LifecycleStatus, str] = {
    LifecycleStatus.QUEUED: "pending",
    LifecycleStatus.RUNNING: "processing",
    LifecycleStatus.SUCCEEDED: "completed",
    LifecycleStatus.FAILED: "failed",
    LifecycleStatus.CANCELLED: "cancelled",
}


def is_legal(from_status: LifecycleStatus, to_status: LifecycleStatus) -> bool:
    return (from_status, to_status) in LEGAL_TRANSITIONS


def is_terminal(status: LifecycleStatus) -> bool:
    return status in TERMINAL
