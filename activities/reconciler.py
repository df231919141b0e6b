"""The reconciler: makes SQL right again when it and Temporal disagree, and keeps the engine's own
machinery running. One pass (a Temporal schedule runs it every RECONCILE_INTERVAL_S):

- expired locks: a running job whose lock expired (lock_until + grace) and whose workflow is
  closed or missing → failed `INTERNAL_LOCK_EXPIRED`; whose workflow still runs but whose
  workflow task keeps failing → reported as stuck (log line + count), not touched;
- waiting jobs: a queued job whose enqueue was published but whose workflow is missing or
  closed (terminated before PREPARE, failed on a workflow task...) → its enqueue goes out again
  and the relay starts a fresh run; a running workflow whose task keeps failing → reported;
- stalled enqueues: an `ai.job.enqueue` row parked as failed while its job is still queued →
  revived with a capped backoff;
- lost cancels: a running job with a cancel request whose workflow still runs → cancel re-sent;
- the relay: if the singleton relay workflow is not running, it is started again;
- retention: expired snapshots deleted; input and output of old terminal jobs removed;
  published outbox rows deleted after OUTBOX_RETENTION_DAYS.

Every pass pages through all its candidates (keyset), so live jobs never hide real orphans.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from activities.metrics import WorkerMetrics, worker_metrics
from db.jobs import JobQueries
from db.lifecycle import LifecycleRepository
from db.outbox import FAILED, OutboxRepository
from db.session import SessionMaker
from engine.contracts import RECONCILE_ONCE, RELAY_WORKFLOW, ReconcileResult, RelayInput
from engine.errors import IllegalTransition, public_message_for
from engine.workflow_state import MISSING, WorkflowState, workflow_state

log = logging.getLogger(__name__)

PAGE = 200
MAX_PER_PASS = 20_000


@dataclass(frozen=True)
class ReconcilerConfig:
    lock_grace_s: float = 30.0
    # A published enqueue gets this long to show up as a workflow before it is re-sent.
    missing_workflow_after_s: float = 60.0
    cancel_resend_after_s: float = 10.0
    # A workflow task that failed this many times in a row is reported as stuck.
    stuck_task_attempts: int = 3
    # Revival of a parked enqueue: backoff base and cap.
    revive_base_s: float = 30.0
    revive_cap_s: float = 300.0
    retention_days: int = 30
    outbox_retention_days: int = 7
    # The singleton relay workflow this reconciler keeps alive (None: not its job).
    relay_workflow_id: str | None = None
    relay_task_queue: str | None = None


class Reconciler:
    def __init__(
        self,
        sessionmaker: SessionMaker,
        client: Client,
        config: ReconcilerConfig | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._sm = sessionmaker
        self._metrics = metrics or worker_metrics()
        self._client = client
        self.config = config or ReconcilerConfig()
        self._lifecycle = LifecycleRepository()
        self._jobs = JobQueries()
        self._outbox = OutboxRepository()

    @activity.defn(name=RECONCILE_ONCE)
    async def reconcile_once(self) -> ReconcileResult:
        return await self.run_once()

    async def _describe(self, workflow_id: str) -> WorkflowState:
        try:
            desc = await self._client.workflow_service.describe_workflow_execution(
                _describe_request(self._client.namespace, workflow_id),
                timeout=timedelta(seconds=10),
            )
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return MISSING
            raise
        return workflow_state(desc)

    def _report_stuck(self, job_id: uuid.UUID, wf_id: str, state: WorkflowState) -> str:
        log.error(
            "workflow task keeps failing; the job cannot progress until it is fixed",
            extra={
                "job_id": str(job_id),
                "workflow_id": wf_id,
                "failing_task_attempts": state.failing_task_attempts,
                "alert": "AIJOBS_STUCK_WORKFLOW",
            },
        )
        return f"stuck {job_id} ({state.failing_task_attempts} failed workflow tasks)"

    async def run_once(self) -> ReconcileResult:
        failed = requeued = resent = stuck = revived = purged = 0
        relay_restarted = False
        details: list[str] = []
        cfg = self.config

        # ---- running jobs whose lock expired -----------------------------------------------
        seen = 0
        after = None
        while seen < MAX_PER_PASS:
            async with self._sm.begin() as s:
                page = await self._lifecycle.find_expired_locks(
                    s, cfg.lock_grace_s, after=after, limit=PAGE
                )
            if not page:
                break
            seen += len(page)
            after = (page[-1].lock_until, page[-1].id)
            for job in page:
                state = await self._describe(job.workflow_id)
                if state.running:
                    if state.failing_task_attempts >= cfg.stuck_task_attempts:
                        stuck += 1
                        details.append(self._report_stuck(job.id, job.workflow_id, state))
                    continue
                if await self._fail_abandoned(job.id, job.job_type):
                    failed += 1
                    details.append(f"failed {job.id}")
            if len(page) < PAGE:
                break

        # ---- queued jobs whose workflow is missing, closed or stuck --------------------------
        seen = 0
        after_id = 0
        while seen < MAX_PER_PASS:
            async with self._sm.begin() as s:
                waiting = await self._jobs.published_enqueues_of_queued_jobs(
                    s, older_than_s=cfg.missing_workflow_after_s, after_id=after_id, limit=PAGE
                )
            if not waiting:
                break
            seen += len(waiting)
            after_id = waiting[-1][0]
            for event_id, job_id, wf_id in waiting:
                state = await self._describe(wf_id)
                if state.running:
                    if state.failing_task_attempts >= cfg.stuck_task_attempts:
                        stuck += 1
                        details.append(self._report_stuck(job_id, wf_id, state))
                    continue
                # Missing, or closed before the job could start: a fresh run is needed.
                async with self._sm.begin() as s:
                    if await self._outbox.requeue_published(s, event_id):
                        requeued += 1
                        details.append(f"requeued {job_id}")
                        log.warning(
                            "queued job had no running workflow; enqueued again",
                            extra={"job_id": str(job_id), "workflow_exists": state.exists},
                        )
            if len(waiting) < PAGE:
                break

        # ---- parked enqueues of jobs that still wait -----------------------------------------
        async with self._sm.begin() as s:
            back = await self._outbox.revive_stalled_enqueues(
                s, base_s=cfg.revive_base_s, cap_s=cfg.revive_cap_s
            )
        for event_id, aggregate_id in back:
            revived += 1
            details.append(f"revived enqueue {event_id} of {aggregate_id}")
            log.warning(
                "parked enqueue revived",
                extra={
                    "event_id": event_id,
                    "job_id": aggregate_id[:64],
                    "alert": "AIJOBS_ENQUEUE_REVIVED",
                },
            )

        # ---- lost cancels --------------------------------------------------------------------
        async with self._sm.begin() as s:
            pending_cancels = await self._jobs.running_with_cancel_requested(
                s, older_than_s=cfg.cancel_resend_after_s
            )
        for job_id, wf_id in pending_cancels:
            if (await self._describe(wf_id)).running:
                try:
                    await self._client.get_workflow_handle(wf_id).cancel()
                    resent += 1
                except RPCError:
                    log.warning("cancel re-send failed", extra={"job_id": str(job_id)})

        # ---- the relay -----------------------------------------------------------------------
        if cfg.relay_workflow_id and cfg.relay_task_queue:
            relay_restarted = await self._ensure_relay(cfg.relay_workflow_id, cfg.relay_task_queue)
            if relay_restarted:
                details.append("relay workflow restarted")

        # ---- retention -----------------------------------------------------------------------
        async with self._sm.begin() as s:
            deleted = await self._jobs.delete_expired_snapshots(s)
        async with self._sm.begin() as s:
            purged = await self._jobs.purge_private_data(s, retention_days=cfg.retention_days)
        async with self._sm.begin() as s:
            outbox_deleted = await self._outbox.delete_published(
                s, older_than_days=cfg.outbox_retention_days
            )

        self._metrics.reconciled(
            {
                "expired_lock_failed": failed,
                "outbox_requeued": requeued,
                "snapshot_deleted": deleted,
                "cancel_resent": resent,
                "stuck_workflow": stuck,
                "enqueue_revived": revived,
                "relay_restarted": int(relay_restarted),
                "private_data_purged": purged,
                "outbox_deleted": outbox_deleted,
            },
            stuck=stuck,
        )
        return ReconcileResult(
            expired_locks_failed=failed,
            outbox_requeued=requeued,
            snapshots_deleted=deleted,
            cancels_resent=resent,
            details=details[:50],
            stuck_workflows=stuck,
            enqueues_revived=revived,
            relay_restarted=relay_restarted,
            private_data_purged=purged,
            outbox_deleted=outbox_deleted,
        )

    async def _fail_abandoned(self, job_id: uuid.UUID, job_type: str) -> bool:
        try:
            async with self._sm.begin() as s:
                await self._lifecycle.mark_failed(
                    s,
                    job_id,
                    "INTERNAL_LOCK_EXPIRED",
                    public_message_for("INTERNAL_LOCK_EXPIRED"),
                    "reconciler: lock expired and the workflow is closed or missing",
                )
                await self._outbox.insert(
                    s,
                    event_type=FAILED,
                    aggregate_type="AiJob",
                    aggregate_id=str(job_id),
                    dedupe_key=f"{FAILED}:{job_id}",
                    payload={
                        "jobId": str(job_id),
                        "jobType": job_type,
                        "errorCode": "INTERNAL_LOCK_EXPIRED",
                    },
                    notify=False,
                )
        except IllegalTransition:
            return False  # it ended meanwhile
        self._metrics.job_finished(job_type, "failed", "INTERNAL_LOCK_EXPIRED")
        log.warning("expired lock reconciled", extra={"job_id": str(job_id), "job_type": job_type})
        return True

    async def _ensure_relay(self, relay_id: str, task_queue: str) -> bool:
        """Start the relay workflow if no run of it is open (terminated, failed, never
        started). Returns True when a new run was started."""
        state = await self._describe(relay_id)
        if state.running:
            return False
        await self._client.start_workflow(
            RELAY_WORKFLOW,
            RelayInput(),
            id=relay_id,
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        )
        log.warning(
            "relay workflow was not running; started it again",
            extra={"workflow_id": relay_id, "alert": "AIJOBS_RELAY_RESTARTED"},
        )
        return True


def _describe_request(namespace: str, workflow_id: str) -> DescribeWorkflowExecutionRequest:
    return DescribeWorkflowExecutionRequest(
        namespace=namespace, execution=WorkflowExecution(workflow_id=workflow_id)
    )
