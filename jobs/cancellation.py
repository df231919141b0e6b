"""Cancel a job: the owner's (or an admin's) request, decided in one transaction.

The transition itself (queued → cancelled with its event, running → cancel requested) is
jobs/lifecycle.py `request_cancel`; this use case finds the job, applies the owner rule and the
job type's `cancellable`, and cancels the workflow after commit, outside the transaction.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy.ext.asyncio import AsyncSession

from db import jobs as jobs_db
from db.session import SessionMaker
from engine.errors import JobNotCancellable
from engine.lifecycle import LifecycleStatus
from jobs import lifecycle
from jobs.spec import Catalog
from jobs.views import Owner, can_see, not_found

log = logging.getLogger(__name__)

CancelOutcome = Literal["cancelled", "cancel_requested"]
WorkflowCanceller = Callable[[str], Awaitable[None]]
# Runs inside the cancel's transaction, after its decision: what must commit or roll back with
# it (an audit entry, a bulk item's state). Raising rolls the cancel back.
CancelHook = Callable[[AsyncSession, CancelOutcome], Awaitable[None]]


@dataclass(frozen=True)
class CancelResult:
    job_id: uuid.UUID
    outcome: CancelOutcome


class JobCancellation:
    """The cancel use case over one session factory and catalog."""

    def __init__(self, sessionmaker: SessionMaker, catalog: Catalog) -> None:
        self._sm = sessionmaker
        self._catalog = catalog

    async def cancel(
        self,
        job_id: uuid.UUID,
        user_id: str,
        *,
        admin: bool = False,
        cancel_workflow: WorkflowCanceller | None = None,
        within: CancelHook | None = None,
    ) -> CancelResult:
        """One transaction locks the job row and decides on its state: queued → cancelled at
        once (with its `ai.job.cancelled` event); running → cancel requested, and the workflow
        ends the job itself; ended → an error naming why. The workflow is cancelled after
        commit, outside the transaction. If that Temporal call fails, the request stays
        recorded: the EXECUTE heartbeat reads it and the reconciler re-sends the cancel."""
        async with self._sm.begin() as s:
            row = await jobs_db.get_for_update(s, job_id)
            # The one owner rule (jobs/views.py): someone else's job reads as missing.
            if row is None or not can_see(Owner(user_id, is_admin=admin), row.user_id):
                raise not_found()
            current = LifecycleStatus(row.lifecycle_status)
            jt = self._catalog.get(row.job_type) if row.job_type in self._catalog else None
            if (
                current in (LifecycleStatus.QUEUED, LifecycleStatus.RUNNING)
                and jt is not None
                and not jt.definition.execution.cancellable
            ):
                # Declared non-cancellable: refused whether it waits or runs, so a client
                # cannot cancel it by being quick.
                raise JobNotCancellable("This job type cannot be cancelled.")
            outcome = await lifecycle.request_cancel(s, job_id, current)
            if within is not None:
                await within(s, outcome)
        if cancel_workflow is not None:
            await _cancel_workflow(cancel_workflow, row.workflow_id, job_id, outcome)
        return CancelResult(job_id, outcome)


async def _cancel_workflow(
    cancel_workflow: WorkflowCanceller, wf_id: str, job_id: uuid.UUID, outcome: CancelOutcome
) -> None:
    """Cancel the job's workflow after commit; a failure is logged, never raised: the
    request is recorded in SQL either way."""
    try:
        await cancel_workflow(wf_id)
    except Exception:
        if outcome == "cancelled":
            # Its workflow may not exist yet; EXECUTE would find the job cancelled anyway, so
            # ending it now is best effort.
            log.info("no workflow to cancel yet", extra={"job_id": str(job_id)})
        else:  # recorded in SQL; the reconciler re-sends
            log.warning("workflow cancel failed", extra={"job_id": str(job_id)})
