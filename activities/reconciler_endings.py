"""The reconciler's endings: a job abandoned by its worker, and a job whose finalizer gave up.

A running job whose lock expired and whose workflow is closed or missing was abandoned: it
fails `INTERNAL_LOCK_EXPIRED` (`abandoned`), keeping what its chunks produced.

A finalizer (`finalize_failed`, `finalize_cancelled`) is a bookkeeping stage: an unexpected error
it meets on every one of its STAGE_INTERNAL_ATTEMPTS attempts (activities/bounded.py) fails its
workflow, and the job is left `queued` or `running` behind a closed workflow. Starting the
workflow again would run the same stages into the same fault, pass after pass, for ever. So
the reconciler does not: when the last run of a waiting job's workflow (or of a running job
whose lock expired) failed in a finalizer, Temporal's close event says which one, and the
reconciler writes the ending that finalizer was writing, itself, by compare-and-set through
`jobs/lifecycle.py`, with the same rules:

- `finalize_cancelled` gave up: the job ends `cancelled`;
- `finalize_failed` gave up: the job ends `failed` with `INTERNAL_ERROR` (a cancel the user asked
  for still wins: `cancelled`), and a job that never ran is taken and failed in the same
  transaction, as the finalizer does.

The finalizer ran in one workflow run, and the reconciler ends the job on the first pass that
sees that run closed: at most one run of the finalizer, never a re-enqueue. If the ending's
own transaction fails (the fault is in the job's row), nothing else is done: the next pass
tries again, and an operator sees it in the log (alert `AIJOBS_FINALIZER_ENDING_FAILED`).
"""

from __future__ import annotations

import logging
import uuid

from temporalio.client import Client

from activities.metrics import WorkerMetrics
from activities.reconciler_pass import Pass
from activities.reconciler_temporal import failed_finalizer
from db.errors import sqlstate
from db.session import SessionMaker
from engine.contracts import FINALIZE_CANCELLED
from engine.errors import IllegalTransition, LockConflict
from engine.workflow_state import WorkflowState
from jobs import lifecycle
from jobs.spec import Catalog

log = logging.getLogger(__name__)

INTERNAL_ERROR = "INTERNAL_ERROR"
RECONCILER_IDENTITY = "reconciler"


class ReconcilerEndings:
    """Ends, for the reconciler, the jobs nothing else will end: abandoned ones, and those whose
    workflow closed because a finalizer gave up."""

    def __init__(
        self,
        sessionmaker: SessionMaker,
        client: Client,
        metrics: WorkerMetrics,
        catalog: Catalog | None = None,
    ) -> None:
        self._sm = sessionmaker
        self._client = client
        self._metrics = metrics
        self._catalog = catalog

    async def handled(
        self, p: Pass, job_id: uuid.UUID, workflow_id: str, state: WorkflowState
    ) -> bool:
        """True when the workflow's last run closed because a finalizer failed: the job was
        ended here (or will be on a later pass, if its ending failed now), and must not be
        started again. False: any other closed or missing workflow, left to the caller."""
        if not state.exists or state.running or state.status != "FAILED":
            return False
        finalizer = await failed_finalizer(self._client, p, workflow_id)
        if finalizer is None:
            return False
        ended = await self.end(job_id, workflow_id, finalizer)
        if ended is not None:
            p.add("finalizer_ended")
            p.details.append(f"{ended} {job_id} (its {finalizer} gave up)")
        return True

    async def end(self, job_id: uuid.UUID, workflow_id: str, finalizer: str) -> str | None:
        """The ending `finalizer` was writing, by CAS; the state it left the job in, or None when
        the job ended meanwhile or the ending failed (tried again on the next pass)."""
        try:
            async with self._sm.begin() as s:
                if finalizer == FINALIZE_CANCELLED:
                    await lifecycle.cancel(s, job_id, catalog=self._catalog)
                    status, code, job_type = "cancelled", "CANCELLED", ""
                else:
                    ending = await lifecycle.finalize_failed(
                        s,
                        job_id,
                        code=INTERNAL_ERROR,
                        owner=workflow_id,
                        identity=RECONCILER_IDENTITY,
                        catalog=self._catalog,
                    )
                    if ending is None:
                        return None
                    status, code, job_type = ending.status.value, ending.code, ending.job_type
        except (IllegalTransition, LockConflict):
            return None  # it ended meanwhile
        except Exception as exc:
            log.error(
                "the reconciler could not end a job whose finalizer gave up; next pass retries",
                extra={
                    "job_id": str(job_id),
                    "finalizer": finalizer,
                    "error_type": type(exc).__name__,
                    "sqlstate": sqlstate(exc),
                    "alert": "AIJOBS_FINALIZER_ENDING_FAILED",
                },
            )
            return None
        # A job workflow's id is `{queueName}:{jobType}:{jobId}`; a job type holds no colon.
        self._metrics.job_finished(job_type or workflow_id.rsplit(":", 2)[-2], status, code)
        log.warning(
            "job ended by the reconciler: its finalizer gave up",
            extra={"job_id": str(job_id), "finalizer": finalizer, "status": status},
        )
        return status

    async def abandoned(self, job_id: uuid.UUID, job_type: str) -> bool:
        """A running job whose lock expired and whose workflow is gone: failed
        `INTERNAL_LOCK_EXPIRED`; False when it ended meanwhile."""
        try:
            async with self._sm.begin() as s:
                await lifecycle.fail(
                    s,
                    job_id,
                    job_type=job_type,
                    code="INTERNAL_LOCK_EXPIRED",
                    internal_message=(
                        "reconciler: lock expired and the workflow is closed or missing"
                    ),
                    catalog=self._catalog,
                )
        except IllegalTransition:
            return False  # it ended meanwhile
        self._metrics.job_finished(job_type, "failed", "INTERNAL_LOCK_EXPIRED")
        log.warning("expired lock reconciled", extra={"job_id": str(job_id), "job_type": job_type})
        return True
