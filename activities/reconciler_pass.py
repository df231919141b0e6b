"""What one reconciler pass keeps (activities/reconciler.py): its counts and details, each
phase's allowance (deadline, describes), the pages it fetched, and the result it reports.

Plain bookkeeping, no I/O: the phases add to one `Pass`, and `Pass.result` and
`Pass.metric_counts` are the only places the counts become the activity's result and its
metrics, so a new count is added in one place.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from activities.metrics import RECONCILER_ACTIONS
from engine.contracts import ReconcileResult
from engine.workflow_state import WorkflowState

log = logging.getLogger("activities.reconciler")

T = TypeVar("T")
# A phase's keyset cursor: where its next page starts (None, or 0 for revival: the beginning).
Cursor = Any
# A phase's handle: what it does about one page; returns the cursor after the last candidate it
# handled and whether it stopped early (out of describes or of time).
Handle = Callable[["Pass", "Phase", T, Cursor], Awaitable[tuple[Cursor, bool]]]
# The waiting and cancel phases' cursor: (created_at or cancel_requested_at, job id).
WaitingKey = tuple[datetime, uuid.UUID]


@dataclass(frozen=True)
class Fetched(Generic[T]):
    """One page a phase fetched: the page itself and how many candidate rows it looked at
    (fewer than the limit asked for means the end of the candidates was reached)."""

    page: T
    seen: int


@dataclass
class Pass:
    """What one pass did so far; every phase adds to it."""

    heartbeat: Callable[[], None] | None
    counts: dict[str, int] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    temporal_calls: int = 0
    described: int = 0
    failed: list[str] = field(default_factory=list)
    cut_short: list[str] = field(default_factory=list)
    reported_stuck: set[uuid.UUID] = field(default_factory=set)

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def beat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat()

    def cut(self, phase: Phase) -> None:
        """`phase` stopped before the end of its candidates (a cap or its deadline)."""
        if phase.name not in self.cut_short:
            self.cut_short.append(phase.name)

    def report_stuck(self, job_id: uuid.UUID, wf_id: str, state: WorkflowState) -> None:
        """A job whose workflow task keeps failing: logged and counted once per pass."""
        if job_id in self.reported_stuck:
            return
        self.reported_stuck.add(job_id)
        self.add("stuck_workflow")
        log.error(
            "workflow task keeps failing; the job cannot progress until it is fixed",
            extra={
                "job_id": str(job_id),
                "workflow_id": wf_id,
                "failing_task_attempts": state.failing_task_attempts,
                "alert": "AIJOBS_STUCK_WORKFLOW",
            },
        )
        self.details.append(f"stuck {job_id} ({state.failing_task_attempts} failed workflow tasks)")

    def metric_counts(self) -> dict[str, int]:
        """The pass's count of each action the reconciler's metric labels (0 when none)."""
        return {k: self.counts.get(k, 0) for k in RECONCILER_ACTIONS}

    def result(self) -> ReconcileResult:
        c = self.counts
        return ReconcileResult(
            expired_locks_failed=c.get("expired_lock_failed", 0),
            outbox_requeued=c.get("outbox_requeued", 0),
            snapshots_deleted=c.get("snapshot_deleted", 0),
            cancels_resent=c.get("cancel_resent", 0),
            details=self.details[:50],
            stuck_workflows=c.get("stuck_workflow", 0),
            enqueues_revived=c.get("enqueue_revived", 0),
            # The relay is no longer restarted by anyone but its process's supervisor; the
            # field stays in the contract (recorded results carry it) and is always false.
            private_data_purged=c.get("private_data_purged", 0),
            outbox_deleted=c.get("outbox_deleted", 0),
            enqueues_closed=c.get("enqueue_closed", 0),
            temporal_calls=self.temporal_calls,
            workflows_described=self.described,
            failed_phases=self.failed,
            phases_cut_short=self.cut_short,
            finalizers_ended=c.get("finalizer_ended", 0),
        )


@dataclass
class Phase:
    """One phase's allowance in this pass."""

    name: str
    deadline: float
    describes_left: int

    def out_of_time(self) -> bool:
        return time.monotonic() >= self.deadline
