"""The reconciler (DESIGN §2.1, §6): makes SQL right again when it and Temporal disagree.

- a running job whose lock expired (lock_until + grace) and whose workflow is closed or missing
  → failed `INTERNAL_LOCK_EXPIRED` (no job stays `running` forever);
- a published enqueue whose job is still queued and whose workflow does not exist → re-enqueued;
- a running job with a cancel request whose workflow still runs → the cancel is sent again;
- expired snapshots → deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from temporalio import activity
from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from db.jobs import JobQueries
from db.lifecycle import LifecycleRepository
from db.outbox import FAILED, OutboxRepository
from db.session import SessionMaker
from engine.contracts import RECONCILE_ONCE, ReconcileResult
from engine.errors import IllegalTransition, public_message_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReconcilerConfig:
    lock_grace_s: float = 30.0
    # A published enqueue gets this long to show up as a workflow before it is re-sent.
    missing_workflow_after_s: float = 60.0
    cancel_resend_after_s: float = 10.0


class Reconciler:
    def __init__(
        self, sessionmaker: SessionMaker, client: Client, config: ReconcilerConfig | None = None
    ) -> None:
        self._sm = sessionmaker
        self._client = client
        self.config = config or ReconcilerConfig()
        self._lifecycle = LifecycleRepository(sessionmaker)
        self._jobs = JobQueries()
        self._outbox = OutboxRepository()

    @activity.defn(name=RECONCILE_ONCE)
    async def reconcile_once(self) -> ReconcileResult:
        return await self.run_once()

    async def _workflow_running(self, workflow_id: str) -> bool | None:
        """True running, False closed, None missing."""
        try:
            desc = await self._client.get_workflow_handle(workflow_id).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        return desc.raw_description.workflow_execution_info.status == (
            WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING
        )

    async def run_once(self) -> ReconcileResult:
        failed = requeued = resent = 0
        details: list[str] = []

        for job in await self._lifecycle.find_expired_locks(self.config.lock_grace_s):
            if await self._workflow_running(job.workflow_id):
                continue
            try:
                async with self._sm.begin() as s:
                    await self._lifecycle.mark_failed(
                        job.id,
                        "INTERNAL_LOCK_EXPIRED",
                        public_message_for("INTERNAL_LOCK_EXPIRED"),
                        "reconciler: lock expired and the workflow is closed or missing",
                        session=s,
                    )
                    await self._outbox.insert(
                        s,
                        event_type=FAILED,
                        aggregate_type="AiJob",
                        aggregate_id=str(job.id),
                        dedupe_key=f"{FAILED}:{job.id}",
                        payload={
                            "jobId": str(job.id),
                            "jobType": job.job_type,
                            "errorCode": "INTERNAL_LOCK_EXPIRED",
                        },
                        notify=False,
                    )
                failed += 1
                details.append(f"failed {job.id}")
                log.warning("expired lock reconciled", extra={"job_id": str(job.id)})
            except IllegalTransition:
                pass  # it ended meanwhile

        async with self._sm.begin() as s:
            stale = await self._jobs.published_enqueues_of_queued_jobs(
                s, older_than_s=self.config.missing_workflow_after_s
            )
        for event_id, job_id, wf_id in stale:
            if await self._workflow_running(wf_id) is None:
                async with self._sm.begin() as s:
                    if await self._outbox.requeue_published(s, event_id):
                        requeued += 1
                        details.append(f"requeued {job_id}")

        async with self._sm.begin() as s:
            pending_cancels = await self._jobs.running_with_cancel_requested(
                s, older_than_s=self.config.cancel_resend_after_s
            )
        for job_id, wf_id in pending_cancels:
            if await self._workflow_running(wf_id):
                try:
                    await self._client.get_workflow_handle(wf_id).cancel()
                    resent += 1
                except RPCError:
                    log.warning("cancel re-send failed", extra={"job_id": str(job_id)})

        async with self._sm.begin() as s:
            deleted = await self._jobs.delete_expired_snapshots(s)

        return ReconcileResult(
            expired_locks_failed=failed,
            outbox_requeued=requeued,
            snapshots_deleted=deleted,
            cancels_resent=resent,
            details=details[:50],
        )
