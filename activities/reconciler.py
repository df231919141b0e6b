"""The reconciler: makes SQL right again when it and Temporal disagree, and keeps the engine's own
machinery running. One pass (a Temporal schedule runs it every RECONCILE_INTERVAL_S) runs these
phases, in this order:

- expired_locks: a running job whose lock expired (lock_until + grace) and whose workflow is
  closed or missing → failed `INTERNAL_LOCK_EXPIRED`; whose workflow still runs but whose
  workflow task keeps failing → reported as stuck (log line + count), not touched;
- waiting: a queued job whose enqueue was published but whose workflow is missing or closed
  (terminated before PREPARE, failed on a workflow task...) → its enqueue goes out again and the
  relay starts a fresh run;
- in both: a workflow that closed because its finalizer gave up is never started again: the job
  ends as that finalizer was ending it (activities/reconciler_endings.py);
- stuck: a sample of waiting jobs' running workflows is described; one whose workflow task keeps
  failing is reported;
- revival: an `ai.job.enqueue` row parked as failed while its job is still queued → revived with
  a capped backoff; the parked row of a job that ended meanwhile → closed;
- cancels: a running job with a cancel request whose workflow still runs → cancel re-sent;
- relay: a relay shard workflow (`outbox-relay-<k>`) that is not running is started;
- schedules: each schedule's Temporal schedule made to match its row when it is missing, paused
  otherwise, or starts runs on another queue (activities/reconciler_schedules.py);
- retention: expired snapshots deleted; the private data of old terminal jobs purged; published
  outbox rows, audit entries, usage rows, idle provider limits and gates, expired leases,
  parked outbox rows and revoked keys after their `*_RETENTION_DAYS` (activities/retention.py);
  batch files due for deletion deleted at the provider (activities/batch_files.py).

Bounded work, whatever the backlog. A healthy waiting job costs no describe: the waiting phase
reads its candidates from SQL a page at a time and asks Temporal's visibility store, in one list
call per page, which of their workflows are running (`WorkflowId IN (...)`); only the others are
described (the authority: visibility is eventually consistent, so a workflow it does not list yet
is never replaced on its word alone; the candidates' enqueues were published at least
`missing_workflow_after_s` ago as well). Each phase looks at no more than `rows_per_phase` rows
and describes no more than `describes_per_phase` workflows per pass, and runs for no more than
`phase_budget_s`; a phase that stops early keeps a keyset cursor (in this process) and the next
pass goes on from there, wrapping round at the end, so every candidate, old or new, is looked at
within a bounded number of passes. A phase that raises or overruns its budget is logged and
counted; the other phases run regardless. The activity heartbeats between pages and phases.

Every paged phase is a fetch (one page of candidates from SQL, in db/) and a handle (what it does
about each), run by one paging loop (`Reconciler._paged`) that owns the caps, the deadline and
the cursor. The pass's bookkeeping is activities/reconciler_pass.py; the questions to Temporal,
activities/reconciler_temporal.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError

from activities.batch_files import BatchFiles
from activities.metrics import WorkerMetrics, worker_metrics
from activities.reconciler_endings import ReconcilerEndings
from activities.reconciler_pass import Cursor, Fetched, Handle, Pass, Phase, T, WaitingKey
from activities.reconciler_schedules import ScheduleRepair
from activities.reconciler_temporal import RPC_TIMEOUT, describe, running_among
from activities.relay_activity import RelayShards, check_relay
from activities.retention import RetentionConfig, run_retention
from db import outbox as outbox_db
from db import outbox_parked as outbox_parked_db
from db import reconciler as reconciler_db
from db.lifecycle import JobLockRow
from db.outbox_parked import ParkedPage
from db.reconciler import CancelRequest, WaitingJob
from db.session import SessionMaker
from engine.contracts import RECONCILE_ONCE, ReconcileResult
from jobs.schedule_dispatch import ScheduleSync
from jobs.spec import Catalog

log = logging.getLogger(__name__)

# ---- the per-pass limits (the one place they are set; ReconcilerConfig defaults to them) ----
# SQL rows per page, and so workflow ids per visibility query.
PAGE = 200
# Candidate rows one phase looks at in one pass; the rest waits for the next pass.
ROWS_PER_PHASE = 10_000
# Describe calls one phase makes in one pass.
DESCRIBES_PER_PHASE = 500
# Running workflows of waiting jobs described per pass to find a workflow task that keeps
# failing (visibility does not say): a stuck one among W waiting jobs is seen within
# ceil(W / STUCK_SAMPLE) passes.
STUCK_SAMPLE = 25
# Wall time of one phase; a phase still busy this much later is cancelled (and counted failed).
PHASE_BUDGET_S = 15.0
PHASE_HARD_STOP_S = 5.0
# How often an idle engine's passes run the retention phase (ReconcilerConfig).
RETENTION_EVERY_S = 300.0

PHASES = tuple("expired_locks waiting stuck revival cancels relay schedules retention".split())
# A running job whose SQL lock expired this long ago is abandoned: with the 60 s lock, the
# specification's 90 s, long enough that a worker's late extension is never taken for death.
LOCK_GRACE_S = 30.0


@dataclass(frozen=True)
class ReconcilerConfig:
    lock_grace_s: float = LOCK_GRACE_S
    # A published enqueue gets this long to show up as a workflow (and in visibility) before its
    # job is a candidate of the waiting phase.
    missing_workflow_after_s: float = 60.0
    cancel_resend_after_s: float = 10.0
    # A workflow task that failed this many times in a row is reported as stuck.
    stuck_task_attempts: int = 3
    # Revival of a parked enqueue: backoff base and cap.
    revive_base_s: float = 30.0
    revive_cap_s: float = 300.0
    retention_days: int = 30  # DATA_RETENTION_DAYS
    outbox_retention_days: int = 7  # RETENTION_DAYS "outbox"
    audit_retention_days: int = 365  # RETENTION_DAYS "admin_audit"
    retention: RetentionConfig = field(default_factory=RetentionConfig)  # the other kinds
    # The relay shard workflows it starts when missing (None: not its job).
    relay_shards: RelayShards | None = None
    # Per-pass limits (tests shrink them; production keeps the module constants).
    page: int = PAGE
    rows_per_phase: int = ROWS_PER_PHASE
    describes_per_phase: int = DESCRIBES_PER_PHASE
    stuck_sample: int = STUCK_SAMPLE
    phase_budget_s: float = PHASE_BUDGET_S
    # Retention runs at the first pass, then again this long later, or at once while the last
    # run found rows: an idle pass costs its reads, not ten purges.
    retention_every_s: float = RETENTION_EVERY_S


class Reconciler:
    def __init__(
        self,
        sessionmaker: SessionMaker,
        client: Client,
        config: ReconcilerConfig | None = None,
        metrics: WorkerMetrics | None = None,
        *,
        catalog: Catalog | None = None,
        schedules: ScheduleSync | None = None,
        batch_files: BatchFiles | None = None,
    ) -> None:
        self._sm = sessionmaker
        self._schedules = ScheduleRepair(sessionmaker, schedules)  # none: the phase does nothing
        # The retention phase's provider side: batch files due for deletion (None: none here).
        self._batch_files = batch_files
        # The job types: an abandoned long-source job keeps what its chunks produced.
        self._catalog = catalog
        self._metrics = metrics or worker_metrics()
        self._client = client
        self.config = config or ReconcilerConfig()
        # Where each phase stopped in the previous pass of this process (None: the start).
        # Only a hint: a restarted worker starts from the beginning again.
        self._cursor: dict[str, Any] = {}
        self._endings = ReconcilerEndings(sessionmaker, client, self._metrics, catalog)
        self._retention_due = 0.0  # monotonic time retention runs again (0: at the next pass)

    @activity.defn(name=RECONCILE_ONCE)
    async def reconcile_once(self) -> ReconcileResult:
        return await self.run_once(heartbeat=activity.heartbeat)

    # ---- the pass --------------------------------------------------------------------------

    async def run_once(self, *, heartbeat: Callable[[], None] | None = None) -> ReconcileResult:
        p = Pass(heartbeat)
        phases: dict[str, Callable[[Pass, Phase], Awaitable[None]]] = {
            "expired_locks": self._expired_locks,
            "waiting": self._waiting,
            "stuck": self._stuck,
            "revival": self._revival,
            "cancels": self._cancels,
            "relay": self._relay,
            "schedules": self._schedules.run,
            "retention": self._retention,
        }
        for name in PHASES:
            await self._run_phase(p, name, phases[name])
        self._metrics.reconciled(
            p.metric_counts(),
            stuck=p.counts.get("stuck_workflow", 0),
            temporal_calls=p.temporal_calls,
        )
        return p.result()

    async def _run_phase(
        self, p: Pass, name: str, run: Callable[[Pass, Phase], Awaitable[None]]
    ) -> None:
        """Runs one phase within its budget. Whatever it raises (a database or Temporal error, a
        bug, its hard time limit) is logged and counted, and the pass goes on with the next
        phase: one broken phase must not stop revival, cancels or retention. A cancellation of
        the activity itself is not caught."""
        budget = self.config.phase_budget_s
        phase = Phase(name, time.monotonic() + budget, self.config.describes_per_phase)
        try:
            async with asyncio.timeout(budget + PHASE_HARD_STOP_S):
                await run(p, phase)
        except Exception as exc:
            p.failed.append(name)
            self._metrics.reconciler_phase_failed(name)
            log.error(
                "reconciler phase failed; the other phases still run",
                extra={
                    "phase": name,
                    "error": type(exc).__name__,
                    "alert": "AIJOBS_RECONCILER_PHASE_FAILED",
                },
                exc_info=not isinstance(exc, TimeoutError),
            )
        p.beat()

    async def _paged(
        self,
        p: Pass,
        phase: Phase,
        fetch: Callable[[Cursor, int], Awaitable[Fetched[T]]],
        handle: Handle[T],
        *,
        start: Cursor = None,
    ) -> None:
        """The one paging loop: from where this phase stopped in the previous pass, fetch a
        page, handle it, heartbeat, and go on until the candidates end (the cursor goes back to
        `start`, so the next pass begins again), the phase has looked at `rows_per_phase` rows,
        run out of time, or its handle stops early (the cursor stays where it stopped). Either
        way the cursor is kept, so every candidate is looked at within a bounded number of
        passes however many there are."""
        cfg = self.config
        after = self._cursor.get(phase.name) or start
        seen = 0
        while True:
            if seen >= cfg.rows_per_phase or phase.out_of_time():
                p.cut(phase)
                break
            limit = min(cfg.page, cfg.rows_per_phase - seen)
            fetched = await fetch(after, limit)
            seen += fetched.seen
            after, stopped = await handle(p, phase, fetched.page, after)
            p.beat()
            if stopped:
                p.cut(phase)
                break
            if fetched.seen < limit:
                after = start  # the end: the next pass starts from the beginning
                break
        self._cursor[phase.name] = after

    # ---- phases: expired locks -------------------------------------------------------------

    async def _expired_locks(self, p: Pass, phase: Phase) -> None:
        """Running jobs whose lock expired: a set that is empty while workers are healthy, so
        each is described (how the workflow ended decides), within the phase's caps."""
        await self._paged(p, phase, self._fetch_expired_locks, self._handle_expired_locks)

    async def _fetch_expired_locks(self, after: Cursor, limit: int) -> Fetched[list[JobLockRow]]:
        async with self._sm.begin() as s:
            page = await reconciler_db.find_expired_locks(
                s, self.config.lock_grace_s, after=after, limit=limit
            )
        return Fetched(page, len(page))

    async def _handle_expired_locks(
        self, p: Pass, phase: Phase, page: list[JobLockRow], after: Cursor
    ) -> tuple[Cursor, bool]:
        for job in page:
            if phase.describes_left <= 0 or phase.out_of_time():
                return after, True
            phase.describes_left -= 1
            state = await describe(self._client, p, job.workflow_id)
            after = (job.lock_until, job.id)
            if state.running:
                if state.failing_task_attempts >= self.config.stuck_task_attempts:
                    p.report_stuck(job.id, job.workflow_id, state)
                continue
            if await self._endings.handled(p, job.id, job.workflow_id, state):
                continue
            if await self._endings.abandoned(job.id, job.job_type):
                p.add("expired_lock_failed")
                p.details.append(f"failed {job.id}")
        return after, False

    # ---- phases: waiting jobs and stuck workflows --------------------------------------------

    async def _waiting(self, p: Pass, phase: Phase) -> None:
        """Queued jobs whose enqueue was published: one visibility query per page says which
        workflows run; only the others are described, and re-enqueued if missing or closed."""
        await self._paged(p, phase, self._fetch_waiting, self._handle_waiting)

    async def _fetch_waiting(
        self, after: WaitingKey | None, limit: int
    ) -> Fetched[list[WaitingJob]]:
        async with self._sm.begin() as s:
            page = await reconciler_db.waiting_jobs_page(
                s,
                published_before_s=self.config.missing_workflow_after_s,
                after=after,
                limit=limit,
            )
        return Fetched(page, len(page))

    async def _handle_waiting(
        self, p: Pass, phase: Phase, page: list[WaitingJob], after: Cursor
    ) -> tuple[Cursor, bool]:
        running = await running_among(self._client, p, [w.workflow_id for w in page])
        for w in page:
            if w.workflow_id not in running:
                if phase.describes_left <= 0 or phase.out_of_time():
                    return after, True
                phase.describes_left -= 1
                await self._check_unlisted(p, w.event_id, w.job_id, w.workflow_id)
            after = (w.created_at, w.job_id)
        return after, False

    async def _check_unlisted(self, p: Pass, event_id: int, job_id: uuid.UUID, wf_id: str) -> None:
        """A waiting job whose workflow visibility does not list as running: Temporal's own word
        (a describe) decides; only a missing or closed workflow is replaced."""
        state = await describe(self._client, p, wf_id)
        if state.running:
            if state.failing_task_attempts >= self.config.stuck_task_attempts:
                p.report_stuck(job_id, wf_id, state)
            return
        if await self._endings.handled(p, job_id, wf_id, state):
            return  # never started again into the same fault
        async with self._sm.begin() as s:
            if await outbox_db.republish_enqueue(s, event_id):
                p.add("outbox_requeued")
                p.details.append(f"requeued {job_id}")
                log.warning(
                    "queued job had no running workflow; enqueued again",
                    extra={"job_id": str(job_id), "workflow_exists": state.exists},
                )

    async def _stuck(self, p: Pass, phase: Phase) -> None:
        """A bounded sample of waiting jobs, taken in turn across passes, is described: a
        workflow whose task keeps failing looks `Running` to visibility. One page of the
        waiting phase's fetch per pass, not the paging loop: the sample is its own cap."""
        cfg = self.config
        if cfg.stuck_sample <= 0:
            return
        after: WaitingKey | None = self._cursor.get(phase.name)
        fetched = await self._fetch_waiting(after, cfg.stuck_sample)
        for w in fetched.page:
            if phase.out_of_time():
                p.cut(phase)
                break
            state = await describe(self._client, p, w.workflow_id)
            after = (w.created_at, w.job_id)
            if state.running and state.failing_task_attempts >= cfg.stuck_task_attempts:
                p.report_stuck(w.job_id, w.workflow_id, state)
        else:
            if fetched.seen < cfg.stuck_sample:
                after = None
        self._cursor[phase.name] = after

    # ---- phases: parked enqueues, cancels ----------------------------------------------------

    async def _revival(self, p: Pass, phase: Phase) -> None:
        """Every parked enqueue, page by page from where the last pass stopped: revived if its
        job waits, closed if its job ended (db/outbox_parked.py `repair_parked_enqueues`)."""
        await self._paged(p, phase, self._fetch_parked, self._handle_parked, start=0)

    async def _fetch_parked(self, after: int, limit: int) -> Fetched[ParkedPage]:
        """One page of parked enqueues, repaired as it is read (the statement revives and
        closes): the handle only reports."""
        async with self._sm.begin() as s:
            page = await outbox_parked_db.repair_parked_enqueues(
                s,
                after_id=after,
                limit=limit,
                base_s=self.config.revive_base_s,
                cap_s=self.config.revive_cap_s,
            )
        return Fetched(page, page.seen)

    async def _handle_parked(
        self, p: Pass, phase: Phase, page: ParkedPage, after: Cursor
    ) -> tuple[Cursor, bool]:
        for event_id, aggregate_id in page.revived:
            p.add("enqueue_revived")
            p.details.append(f"revived enqueue {event_id} of {aggregate_id}")
            log.warning(
                "parked enqueue revived",
                extra={
                    "event_id": event_id,
                    "job_id": aggregate_id[:64],
                    "alert": "AIJOBS_ENQUEUE_REVIVED",
                },
            )
        if page.closed:
            p.add("enqueue_closed", len(page.closed))
            log.info("parked enqueues of ended jobs closed", extra={"count": len(page.closed)})
        return page.next_after, False

    async def _cancels(self, p: Pass, phase: Phase) -> None:
        """Running jobs with an old cancel request: the cancel is re-sent to those whose
        workflow visibility lists as running (one list call per page)."""
        await self._paged(p, phase, self._fetch_cancels, self._handle_cancels)

    async def _fetch_cancels(
        self, after: WaitingKey | None, limit: int
    ) -> Fetched[list[CancelRequest]]:
        async with self._sm.begin() as s:
            page = await reconciler_db.cancel_requested_page(
                s, older_than_s=self.config.cancel_resend_after_s, after=after, limit=limit
            )
        return Fetched(page, len(page))

    async def _handle_cancels(
        self, p: Pass, phase: Phase, page: list[CancelRequest], after: Cursor
    ) -> tuple[Cursor, bool]:
        running = await running_among(self._client, p, [c.workflow_id for c in page])
        for c in page:
            after = (c.requested_at, c.job_id)
            if c.workflow_id not in running:
                continue  # closed: the expired-lock phase ends the job once its lock runs out
            p.temporal_calls += 1
            try:
                handle = self._client.get_workflow_handle(c.workflow_id)
                await handle.cancel(rpc_timeout=RPC_TIMEOUT)
                p.add("cancel_resent")
            except RPCError:
                log.warning("cancel re-send failed", extra={"job_id": str(c.job_id)})
        return after, False

    # ---- phases: the relay, retention ------------------------------------------------

    async def _relay(self, p: Pass, phase: Phase) -> None:
        c = await check_relay(self._client, self.config.relay_shards)
        p.temporal_calls += c.calls
        p.details.extend(c.notes)

    async def _retention(self, p: Pass, phase: Phase) -> None:
        """A bounded page of each kind (activities/retention.py), when due (`retention_every_s`)."""
        c = self.config
        if time.monotonic() < self._retention_due:
            return
        days = replace(
            c.retention,
            data_days=c.retention_days,
            outbox_days=c.outbox_retention_days,
            audit_days=c.audit_retention_days,
        )
        removed = await run_retention(self._sm, days)
        for name, n in removed.items():
            p.add(name, n)
        found = any(removed.values())
        if self._batch_files is not None:  # after the purges, which may have made some due
            deleted = await self._batch_files.delete_due()
            p.add("batch_files_deleted", deleted)
            found = found or deleted > 0
        # Rows found: more may wait behind the pages (the next pass runs it again).
        self._retention_due = 0.0 if found else time.monotonic() + c.retention_every_s
