"""The outbox relay (docs/architecture.md): claim → start workflow → mark published.

`Relay.run` is the loop. It runs inside the long heartbeating `outbox_relay` activity of each
relay shard workflow (`outbox-relay-<k>`, activities/relay_activity.py) on `ai-system` workers,
so Temporal keeps it alive: a worker that dies stops heartbeating and the activity is retried
on another one. `aijobs relay` may run the same loop outside Temporal, beside the webhook
deliverer. Several relays may run at once: claims are disjoint (SKIP LOCKED) and a workflow id
is per job, so a row dispatched twice after a crash starts its workflow once ("already started"
counts as success). Nothing is sent to Temporal while a transaction is open. The loop counts its
progress (`dispatched`, `batches`, `last_*`) for the activity's heartbeat details.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg
from temporalio.client import Client
from temporalio.common import (
    Priority,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from activities.metrics import WorkerMetrics, worker_metrics
from activities.relay_context import row_context
from activities.relay_due import lag_s, sleep_s, still_ahead
from activities.relay_failures import UNREACHABLE as _UNREACHABLE
from activities.relay_failures import DispatchFailure, FailureKind
from activities.relay_flow import expire_due, expiring, next_wake
from activities.relay_schedules import dispatch_schedule_event
from db import outbox as outbox_db
from db import relay as relay_db
from db import webhook_deliveries as deliveries_db
from db.bulk import BULK_START
from db.lifecycle import JOB_CHANGED_CHANNEL
from db.outbox import (
    CANCELLED,
    COMPLETED,
    ENQUEUE,
    FAILED,
    OutboxRow,
    enqueue_dedupe_key,
    listen_connection,
)
from db.session import SessionMaker
from engine import search_attributes
from engine.contracts import (
    BULK_WORKFLOW,
    BulkInput,
    JobWorkflowInput,
    bulk_workflow_id,
    workflow_id,
)
from engine.definition import QUEUE_NAMES, SYSTEM_QUEUE, priority_key
from engine.schedules import SCHEDULE_EVENTS
from jobs.schedule_dispatch import CATCHUP_WINDOW_S, ScheduleSync
from jobs.spec import Catalog

log = logging.getLogger(__name__)
# Domain events with no subscriber in this process: published (acknowledged), not dispatched.
KNOWN_DOMAIN_EVENTS = frozenset({COMPLETED, FAILED, CANCELLED})
# A claimed row whose relay went silent this long goes back to pending for another relay: a
# batch is dispatched in well under a second, so a minute means its relay died, and no live
# relay's slow batch (a Temporal hiccup) is taken from it.
CLAIM_TTL_S = 60.0


@dataclass(frozen=True)
class RelayConfig:
    database_url: str
    task_queue_suffix: str = ""
    poll_interval_s: float = 1.0
    lock_ttl_s: float = CLAIM_TTL_S
    batch_size: int = 100
    max_in_flight: int = 64
    release_every_s: float = 15.0
    # Attach the jobs' fairness keys when starting their workflows (off: the bench's baseline).
    fairness: bool = True
    # A job created while its user had at most `light_jobs` active jobs (itself included) is
    # dispatched with `light_boost` times its user's weight: a user with a few jobs goes ahead
    # of another user's backlog instead of taking turns with it. 0 turns it off. Four jobs and
    # eight times the weight: docs/benchmarks.md's fairness figure (a light user's time within
    # 2x of alone beside a heavy user's forty).
    light_jobs: int = 4
    light_boost: float = 8.0
    # USER_DISPATCH_WINDOW: a user's jobs dispatched and not yet ended, at most; the user's
    # further jobs wait in the outbox and go out in the user's priority order (db/relay.py).
    user_window: int = relay_db.DEFAULT_WINDOW
    # A job's change (its end makes room in a window) wakes the relay at most this often; the
    # outbox's own NOTIFY and the poll are not held back by it.
    job_wake_s: float = 0.2
    owner: str = field(
        # Unique per relay instance: a memory address (id()) can come back in another process
        # or later in this one, and two relays with one owner would release each other's claims.
        default_factory=lambda: f"relay:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
    )


class Relay:
    def __init__(
        self,
        sessionmaker: SessionMaker,
        client: Client,
        catalog: Catalog,
        config: RelayConfig,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._sm = sessionmaker
        self._metrics = metrics or worker_metrics()
        self._client = client
        self._catalog = catalog
        self.config = config
        self._schedules = ScheduleSync(
            sessionmaker,
            client,
            suffix=config.task_queue_suffix,
            catchup_s=CATCHUP_WINDOW_S,
        )
        self._sem = asyncio.Semaphore(config.max_in_flight)
        self.started = 0  # workflows this relay started (tests and metrics)
        self.unavailable_streak = 0
        # Progress, for the relay activity's heartbeat: rows settled, batches, the last batch's
        # size and wall time, the last failure's type or kind and its time.
        self.dispatched = self.batches = self.last_batch = 0
        self.last_batch_at: datetime | None = None
        self.last_error: str | None = None
        self.last_error_at: datetime | None = None
        self._last_claim = 0.0  # monotonic time of the last claim
        # Monotonic time of the next due time or expiry the last claim saw, or None.
        self._next_due: float | None = None

    # ---- the loop ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Drain, then sleep until NOTIFY or the poll interval; release expired claims now and
        then. Returns when `stop` is set. A failed iteration (PostgreSQL restarting, a network
        blip) backs off here; anything else escapes to the supervisor, which starts the loop
        again."""
        last_release = 0.0
        failures = 0
        listener: psycopg.AsyncConnection[object] | None = None
        try:
            while not stop.is_set():
                if listener is None or listener.closed:
                    listener = await self._listen()
                try:
                    if time.monotonic() - last_release > self.config.release_every_s:
                        last_release = time.monotonic()
                        await self.release_expired()
                    while await self.run_once() >= self.config.batch_size:
                        if stop.is_set():
                            return
                    failures = 0
                except Exception as exc:
                    # Keep the relay alive and back off. Rows claimed but not marked stay
                    # `processing` until their TTL, then go out again; starting a workflow
                    # twice is a no-op.
                    failures += 1
                    self._note_error(type(exc).__name__)
                    log.warning("relay iteration failed (%d in a row); backing off", failures)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), min(5.0, 0.2 * 2**failures))
                    continue
                await self._wait(listener, stop)
        finally:
            if listener is not None:
                with contextlib.suppress(Exception):
                    await listener.close()

    async def _listen(self) -> psycopg.AsyncConnection[object] | None:
        try:
            conn = await listen_connection(self.config.database_url)
        except Exception:
            log.warning("relay could not LISTEN; polling only")
            return None
        try:
            await relay_db.listen_job_changes(conn)
        except Exception:
            log.warning("relay could not LISTEN for job changes; polling for room only")
        return conn

    async def _wait(
        self, listener: psycopg.AsyncConnection[object] | None, stop: asyncio.Event
    ) -> None:
        """NOTIFY is only a hint: wake on it, on the stop, at the next due or expiry time or
        after the poll interval, whichever is first."""
        timeout = sleep_s(self.config.poll_interval_s, self._next_due, self.config.job_wake_s)
        if listener is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout)
            return
        try:
            async for note in listener.notifies(timeout=timeout, stop_after=1):
                if note.channel == JOB_CHANGED_CHANNEL:
                    # Jobs change several times each: one claim per `job_wake_s` at most (the
                    # notifications meanwhile wait in the connection and wake the next wait).
                    rest = self._last_claim + self.config.job_wake_s - time.monotonic()
                    if rest > 0:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), rest)
                break
        except Exception:
            with contextlib.suppress(Exception):
                await listener.close()

    # ---- one batch -------------------------------------------------------------------

    async def release_expired(self) -> int:
        """Expired claims go back to pending; held enqueue rows whose job ended while held (a
        cancel ends a queued job in SQL at once) are closed, as nothing is left to start."""
        async with self._sm.begin() as s:
            n = await outbox_db.release_expired(s, ttl_s=self.config.lock_ttl_s)
            closed = await relay_db.close_ended_held(s)
        if n:
            log.warning("released %d expired outbox claims", n)
        if closed:
            log.info("closed %d held enqueue rows of jobs that ended while held", closed)
        return n

    async def claim(self) -> list[OutboxRow]:
        """One batch, claimed in one round trip (BEGIN, the claim and COMMIT pipelined); the
        next due and expiry times it read are kept for the loop's sleep, and the undispatched
        jobs whose time came are expired (activities/relay_flow.py)."""
        claimed = await relay_db.claim(
            self._sm,
            owner=self.config.owner,
            limit=self.config.batch_size,
            window=self.config.user_window,
        )
        self._next_due = next_wake(claimed)
        if expiring(claimed):
            await expire_due(self._sm, self._metrics, self.config.batch_size)
            self._next_due = time.monotonic()  # more may be due: the next wait is short
        return claimed

    async def run_once(self) -> int:
        """Claim one batch and dispatch it; returns how many rows were claimed. A bad row fails
        alone: every row gets its own outcome, whatever happens to the others."""
        self._last_claim = time.monotonic()
        rows = await self.claim()
        if not rows:
            return 0
        results = await asyncio.gather(*(self._dispatch(r) for r in rows))
        ok = [r.id for r, res in zip(rows, results, strict=True) if res is None]
        failed = [(r, res) for r, res in zip(rows, results, strict=True) if res is not None]
        for r, res in zip(rows, results, strict=True):
            outcome: str
            if res is not None:
                outcome = res.kind
            else:
                outcome = "started" if r.event_type == ENQUEUE else "acknowledged"
            self._metrics.relayed(_event_label(r.event_type), outcome)
        # A job's end becomes its owner's webhook deliveries in the transaction that marks it.
        ended = [r.id for r in rows if r.id in ok and r.event_type in KNOWN_DOMAIN_EVENTS]
        if not failed:
            # The usual batch: marks and deliveries in one round trip.
            await relay_db.publish(self._sm, ok, ended, owner=self.config.owner)
        else:
            await self._settle(ok, ended, failed)
        self.dispatched += len(rows)
        self.batches += 1
        self.last_batch, self.last_batch_at = len(rows), datetime.now(UTC)
        if failed:
            self._note_error(f"dispatch {failed[-1][1].kind}")
        if failed and all(res.kind == "unavailable" for _, res in failed):
            # Temporal is unreachable: slow the whole relay down, not only these rows.
            self.unavailable_streak += 1
            await asyncio.sleep(min(5.0, 0.25 * 2**self.unavailable_streak))
        else:
            self.unavailable_streak = 0
        return len(rows)

    def _note_error(self, what: str) -> None:
        self.last_error, self.last_error_at = what, datetime.now(UTC)

    async def _settle(
        self,
        ok: list[int],
        ended: list[int],
        failed: list[tuple[OutboxRow, DispatchFailure]],
    ) -> None:
        """A batch with failures: the published rows, their deliveries and each failure's
        outcome, in one transaction."""
        async with self._sm.begin() as s:
            await outbox_db.mark_published(s, ok, owner=self.config.owner)
            await deliveries_db.fan_out(s, ended)
            for row, res in failed:
                if res.kind == "malformed":  # never dispatchable: `failed`, never retried
                    await outbox_db.mark_undispatchable(
                        s, row.id, owner=self.config.owner, error=res.error
                    )
                    status: str | None = "failed"
                else:
                    status = await outbox_db.mark_failed(
                        s,
                        row.id,
                        owner=self.config.owner,
                        error=res.error,
                        count_attempt=res.kind == "retry",
                    )
                with row_context(row):
                    log.warning(
                        "outbox dispatch failed",
                        extra={
                            "event_id": row.id,
                            "job_id": row.aggregate_id[:64],
                            "status": status,
                            "failure": res.kind,
                        },
                    )

    async def _dispatch(self, row: OutboxRow) -> DispatchFailure | None:
        """Start the row's workflow; None on success. Never raises: the outcome is per row."""
        try:
            # The row's trace context is the current one while it is dispatched, so the tracing
            # interceptor's StartWorkflow span (and through its headers the workflow) joins the
            # trace of the request that created the job; a row without one starts its own.
            with row_context(row):
                return await self._dispatch_row(row)
        except Exception as exc:  # a bug must not take the batch down with it
            return DispatchFailure("retry", f"{type(exc).__name__}: {str(exc)[:300]}")

    async def _dispatch_row(self, row: OutboxRow) -> DispatchFailure | None:
        if row.event_type in KNOWN_DOMAIN_EVENTS:
            return None
        if row.event_type == BULK_START:
            return await self._start_bulk(row)
        if row.event_type in SCHEDULE_EVENTS:
            async with self._sem:
                return await dispatch_schedule_event(self._schedules, row)
        if row.event_type != ENQUEUE:
            log.warning(
                "unknown outbox event type; marked published, not dispatched",
                extra={"event_id": row.id, "event_type": row.event_type[:64]},
            )
            return None
        p = row.payload if isinstance(row.payload, dict) else {}
        try:
            job_id = str(uuid.UUID(str(p["jobId"])))
            job_type = str(p["jobType"])
            queue = str(p["queueName"])
            fairness_key = str(p.get("fairnessKey") or "")[:64] if self.config.fairness else ""
            fairness_weight = float(p.get("fairnessWeight") or 1.0)
            user_active = int(p.get("userActive") or 0)
        except (KeyError, TypeError, ValueError):
            return DispatchFailure("malformed", "malformed enqueue payload")
        if queue not in QUEUE_NAMES:
            return DispatchFailure("malformed", f"unknown queueName {queue[:64]!r}")
        if 0 < user_active <= self.config.light_jobs:
            fairness_weight *= self.config.light_boost
        if job_type not in self._catalog:
            # Possibly a newer job type than this relay knows (a rolling deploy): retried, and
            # revived by the reconciler while the job waits.
            return DispatchFailure("retry", f"unknown jobType {job_type[:64]!r}")
        # The job type's own priority, set by the operator, never the client's: Temporal
        # orders priority keys before fairness keys across every user, so a client's urgency
        # would jump other users' jobs. A user's own jobs are ordered by the client's priority
        # before they get here (the dispatch window, db/relay.py).
        type_priority = self._catalog.get(job_type).definition.queue.default_priority
        async with self._sem:
            try:
                await self._client.start_workflow(
                    job_type,
                    JobWorkflowInput(
                        jobId=job_id,
                        jobType=job_type,
                        # Derived from the job id: no user id or client key reaches Temporal.
                        idempotencyKey=enqueue_dedupe_key(job_id),
                        createdAt=row.created_at.isoformat(),
                        runAt=still_ahead(p.get("runAt")),
                    ),
                    id=workflow_id(queue, job_type, job_id),
                    task_queue=f"{queue}{self.config.task_queue_suffix}",
                    # A closed run that failed, was terminated or timed out may be replaced by a
                    # fresh one (the reconciler re-enqueues a queued job whose run died); a
                    # completed run is never started twice, a running one is reused.
                    id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    search_attributes=TypedSearchAttributes(
                        [
                            SearchAttributePair(search_attributes.JOB_ID, job_id),
                            SearchAttributePair(search_attributes.JOB_TYPE, job_type),
                            SearchAttributePair(search_attributes.LIFECYCLE_STATUS, "queued"),
                        ]
                    ),
                    # Activities inherit it: EXECUTE waits for a slot in the job types'
                    # priority order, and within one fairly across users (by their weights).
                    priority=Priority(
                        priority_key=priority_key(type_priority),
                        fairness_key=fairness_key or None,
                        fairness_weight=fairness_weight if fairness_key else None,
                    ),
                )
                self.started += 1
                self._metrics.relay_lagged(queue, lag_s(row))
            except WorkflowAlreadyStartedError:
                pass  # it ran already: at-least-once delivery, exactly-once start
            except RPCError as exc:
                kind: FailureKind = "unavailable" if exc.status in _UNREACHABLE else "retry"
                return DispatchFailure(kind, f"RPCError {exc.status.name if exc.status else ''}")
            except Exception as exc:
                return DispatchFailure("retry", f"{type(exc).__name__}: {str(exc)[:300]}")
        return None

    async def _start_bulk(self, row: OutboxRow) -> DispatchFailure | None:
        """Start an admin bulk operation's workflow on `ai-system` (docs/admin.md). Its id is
        the operation's: a second start reuses a running one and never reruns a closed one."""
        p = row.payload if isinstance(row.payload, dict) else {}
        try:
            inp = BulkInput(
                operation_id=str(uuid.UUID(str(p["operationId"]))),
                action=str(p["action"]),
                page_size=int(p["pageSize"]),
                jobs_per_second=float(p["jobsPerSecond"]),
            )
        except (KeyError, TypeError, ValueError):
            return DispatchFailure("malformed", "malformed bulk start payload")
        async with self._sem:
            try:
                await self._client.start_workflow(
                    BULK_WORKFLOW,
                    inp,
                    id=bulk_workflow_id(inp.operation_id),
                    task_queue=f"{SYSTEM_QUEUE}{self.config.task_queue_suffix}",
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                )
            except WorkflowAlreadyStartedError:
                pass
            except RPCError as exc:
                kind: FailureKind = "unavailable" if exc.status in _UNREACHABLE else "retry"
                return DispatchFailure(kind, f"RPCError {exc.status.name if exc.status else ''}")
        return None


def _event_label(event_type: str) -> str:
    return event_type if event_type == ENQUEUE or event_type in KNOWN_DOMAIN_EVENTS else "other"
