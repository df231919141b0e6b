"""The outbox relay (docs/architecture.md): claim → start workflow → mark published.

`Relay.run` is the loop. It runs inside the long heartbeating `outbox_relay` activity of each
relay shard workflow (`outbox-relay-<k>`, activities/relay_activity.py) on `ai-system` workers,
so Temporal keeps it alive: a worker that dies stops heartbeating and the activity is retried
on another one. `aijobs relay` may run the same loop outside Temporal, beside the webhook
deliverer. Several relays may run at once: claims are disjoint (SKIP LOCKED) and a workflow id
is per job, so a row dispatched twice after a crash starts its workflow once ("already started"
counts as success). Nothing is sent to Temporal while a transaction is open. What each event
type's dispatch does is activities/relay_dispatch.py. The loop counts its progress
(`dispatched`, `batches`, `last_*`) for the activity's heartbeat details.

Wake-ups come from the process's listener (db/listener.py), never from a connection of the
relay's own; when it claims, publishes or sleeps is activities/relay_wake.py. Each claimed batch
is dispatched in a task of its own (at most `max_in_flight` rows at once), so a batch of slow
starts never holds the next claim back; the batch is then marked published by the next claim's
transaction, or on its own shortly after. Every `release_every_s` a claim first puts back the
claims another relay let expire and closes the held rows of jobs that ended while held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from temporalio.client import Client

from activities.metrics import WorkerMetrics, worker_metrics
from activities.relay_context import row_context
from activities.relay_dispatch import KNOWN_DOMAIN_EVENTS, Dispatch, event_label
from activities.relay_failures import DispatchFailure
from activities.relay_flow import expire_due, expiring, wake_in_s
from activities.relay_stats import QueueStats
from activities.relay_wake import Wake, WakeTimes
from db import outbox as outbox_db
from db import relay as relay_db
from db import webhook_deliveries as deliveries_db
from db.lifecycle import JOB_CHANGED_CHANNEL
from db.listener import Listener
from db.outbox import ENQUEUE, NOTIFY_CHANNEL, OutboxRow
from db.session import SessionMaker
from jobs.spec import Catalog

log = logging.getLogger(__name__)
__all__ = ["CLAIM_TTL_S", "KNOWN_DOMAIN_EVENTS", "DispatchFailure", "Relay", "RelayConfig"]
# A claimed row whose relay went silent this long goes back to pending for another relay: a
# batch is dispatched in well under a second, so a minute means its relay died, and no live
# relay's slow batch (a Temporal hiccup) is taken from it.
CLAIM_TTL_S = 60.0


@dataclass(frozen=True)
class RelayConfig:
    database_url: str
    task_queue_suffix: str = ""
    poll_interval_s: float = 30.0
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
    # While rows are held, a job's change (its end makes room in a window) wakes the relay at
    # most this often; the outbox's own NOTIFY and the poll are never held back by it.
    job_wake_s: float = 0.2
    # Claims at most this often (a quiet relay claims at once); a dispatched batch is marked
    # by the next claim, or alone this long after (activities/relay_wake.py).
    claim_every_s: float = 0.05
    publish_within_s: float = 0.1
    # The name of the relay's own listener when it is given none (a relay run alone).
    application_name: str = "aijobs-relay"
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
        *,
        listener: Listener | None = None,
    ) -> None:
        self._sm = sessionmaker
        self._metrics = metrics or worker_metrics()
        self.config = config
        self.dispatch = Dispatch(sessionmaker, client, catalog, config, self._metrics)
        self._listener = listener
        self.unavailable_streak = 0
        # Progress, for the relay activity's heartbeat: rows settled, batches, the last batch's
        # size and wall time, the last failure's type or kind and its time.
        self.dispatched = self.batches = self.last_batch = 0
        self.last_batch_at: datetime | None = None
        self.last_error: str | None = None
        self.last_error_at: datetime | None = None
        # When to claim, publish or sleep; the listener's handlers record into it.
        self.wake = Wake(
            WakeTimes(
                config.poll_interval_s,
                config.job_wake_s,
                config.claim_every_s,
                config.publish_within_s,
            )
        )
        self._last_release = 0.0
        # The queue tables' statistics, refreshed after a slow claim (activities/relay_stats.py).
        self.stats = QueueStats(sessionmaker)
        # Batches being dispatched (each in its task) and the rows in them; the dispatched
        # rows no transaction has marked published yet, and the job events among them.
        self._batches: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._unmarked: list[int] = []
        self._unmarked_ended: list[int] = []

    @property
    def started(self) -> int:
        """Workflows this relay started (tests and metrics)."""
        return self.dispatch.started

    @property
    def holding(self) -> bool:
        """The last claim left enqueue rows held by their users' dispatch windows."""
        return self.wake.holding

    # ---- wake-ups ------------------------------------------------------------------------

    def on_outbox(self, payload: str | None) -> None:
        self.wake.on_outbox(payload)

    def on_job_changed(self, payload: str | None) -> None:
        self.wake.on_job_changed(payload)

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Follow `listener`'s channels; returns what stops it."""
        offs = [
            listener.on(NOTIFY_CHANNEL, self.on_outbox),
            listener.on(JOB_CHANGED_CHANNEL, self.on_job_changed),
        ]

        def stop() -> None:
            for off in offs:
                off()

        return stop

    # ---- the loop ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Claim whenever woken and there is room, and dispatch each claimed batch in a task of
        its own: a batch whose starts are slow (a loaded Temporal) never holds the next claim
        back, up to `max_in_flight` rows at once. Sleep until a wake-up, the next retry or the
        poll interval. Returns when `stop` is set, once the batches in hand are settled. A
        failed claim (PostgreSQL restarting, a network blip) backs off here; anything else
        escapes to the supervisor, which starts the loop again."""
        listener, own = self._listener, self._listener is None
        if listener is None:  # a relay run on its own: a listener of its own
            listener = Listener(
                self.config.database_url, application_name=self.config.application_name
            )
        stop_listening = self.listen(listener)
        if own:
            listener.start()
        failures = 0
        try:
            while not stop.is_set():
                await self._wait(stop)
                try:
                    action = self.wake.due(time.monotonic(), self._blocked())
                    if action == "claim":
                        if await self._claim_and_spawn() >= self.config.batch_size:
                            self.wake.claim_now = True  # a full claim: more may be due
                    elif action == "publish":
                        await self._mark()
                    failures = 0
                except Exception as exc:
                    # Keep the relay alive and back off. Rows claimed but not marked stay
                    # `processing` until their TTL, then go out again; starting a workflow
                    # twice is a no-op.
                    failures += 1
                    self.wake.claim_now = True
                    self._note_error(type(exc).__name__)
                    log.warning("relay iteration failed (%d in a row); backing off", failures)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), min(5.0, 0.2 * 2**failures))
        finally:
            stop_listening()
            if self._batches:  # the batches in hand are finished and settled
                await asyncio.gather(*self._batches, return_exceptions=True)
            with contextlib.suppress(Exception):  # else they go out again after their TTL
                await self._mark()
            await self.stats.close()
            if own:
                await listener.close()

    def _blocked(self) -> bool:
        return self._in_flight >= self.config.max_in_flight

    async def _wait(self, stop: asyncio.Event) -> None:
        """Until a claim or a publish is due (activities/relay_wake.py), or the stop."""
        await self.wake.wait(stop, self._blocked)

    async def _claim_and_spawn(self) -> int:
        """A claim of what the free dispatch slots allow, its batch dispatched in a task; how
        many rows it claimed."""
        rows = await self.claim(limit=max(1, self.config.max_in_flight - self._in_flight))
        if rows:
            self._in_flight += len(rows)
            task = asyncio.create_task(self._batch(rows), name="relay-batch")
            self._batches.add(task)
            task.add_done_callback(self._batch_done)
        return len(rows)

    async def _batch(self, rows: list[OutboxRow]) -> None:
        try:
            await self._handle(rows)
        except Exception as exc:  # a failed mark: its rows go out again after their TTL
            self._note_error(type(exc).__name__)
            log.warning("relay batch not settled: %s", type(exc).__name__)
        finally:
            self._in_flight -= len(rows)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._batches.discard(task)
        self.wake.kick.set()  # room for the next claim

    # ---- one batch -------------------------------------------------------------------

    async def claim(self, limit: int | None = None) -> list[OutboxRow]:
        """One batch (at most `limit`, else `batch_size` rows), claimed in one round trip
        (BEGIN, the claim and COMMIT pipelined), with the dispatched rows not yet marked
        published marked first, and every `release_every_s` the expired claims put back. The
        next due and expiry times it read wake the relay then; undispatched jobs whose time
        came are expired (activities/relay_flow.py)."""
        now, heard = time.monotonic(), self.wake.heard
        release = now - self._last_release >= self.config.release_every_s
        # Copies: a batch that ends during the round trip adds to the lists.
        marks, ended = list(self._unmarked), list(self._unmarked_ended)
        got = await relay_db.claim_batch(
            self._sm,
            owner=self.config.owner,
            limit=min(limit or self.config.batch_size, self.config.batch_size),
            window=self.config.user_window,
            release_ttl_s=self.config.lock_ttl_s if release else None,
            publish=marks,
            ended=ended,
        )
        self._marked(marks, ended)
        self.stats.after_claim(time.monotonic() - now)
        wake_in = wake_in_s(got)
        if expiring(got):  # undispatched jobs reached their start-by time or deadline
            await expire_due(self._sm, self._metrics, self.config.batch_size)
            wake_in = 0.0  # more may be due: look again soon
        self.wake.claimed(now, got.holding, wake_in, heard)
        if release:
            self._last_release = now
        if got.released:
            log.warning("released %d expired outbox claims", got.released)
        if got.closed:
            log.info("closed %d held enqueue rows of jobs that ended while held", got.closed)
        return got.rows

    async def _mark(self) -> None:
        """Mark the dispatched rows no claim carried published, with their deliveries."""
        # Copies: a batch that ends during the round trip adds to the lists.
        marks, ended = list(self._unmarked), list(self._unmarked_ended)
        if marks:
            await relay_db.publish(self._sm, marks, ended, owner=self.config.owner)
        self._marked(marks, ended)

    def _marked(self, marks: list[int], ended: list[int]) -> None:
        done = set(marks)
        self._unmarked = [i for i in self._unmarked if i not in done]
        self._unmarked_ended = [i for i in self._unmarked_ended if i not in done]
        if not self._unmarked:
            self.wake.publish_due = None

    async def release_expired(self) -> int:
        """Expired claims go back to pending; held enqueue rows whose job ended while held (a
        cancel ends a queued job in SQL at once) are closed, as nothing is left to start."""
        async with self._sm.begin() as s:
            n = await outbox_db.release_expired(s, ttl_s=self.config.lock_ttl_s)
            await relay_db.close_ended_held(s)
        return n

    async def run_once(self) -> int:
        """Claim one batch and dispatch and settle it before returning (tests, tools); returns
        how many rows were claimed. While Temporal is unreachable it also waits out the
        relay's backoff, as the loop does."""
        rows = await self.claim()
        if rows:
            await self._handle(rows)
            await self._mark()
        pause = self.wake.paused_until - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        return len(rows)

    async def _handle(self, rows: list[OutboxRow]) -> None:
        """Dispatch a claimed batch and settle it. A bad row fails alone: every row gets its
        own outcome, whatever happens to the others."""
        results = await asyncio.gather(*(self._dispatch(r) for r in rows))
        ok = [r.id for r, res in zip(rows, results, strict=True) if res is None]
        failed = [(r, res) for r, res in zip(rows, results, strict=True) if res is not None]
        for r, res in zip(rows, results, strict=True):
            outcome: str
            if res is not None:
                outcome = res.kind
            else:
                outcome = "started" if r.event_type == ENQUEUE else "acknowledged"
            self._metrics.relayed(event_label(r.event_type), outcome)
        # A job's end becomes its owner's webhook deliveries in the transaction that marks it.
        ended = [r.id for r in rows if r.id in ok and r.event_type in KNOWN_DOMAIN_EVENTS]
        if not failed:
            # The usual batch: marked (and its deliveries written) by the next claim, or alone
            # shortly (`publish_within_s`).
            self._unmarked += ok
            self._unmarked_ended += ended
            self.wake.publish_by(time.monotonic() + self.config.publish_within_s)
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
            pause = min(5.0, 0.25 * 2**self.unavailable_streak)
            self.wake.paused_until = max(self.wake.paused_until, time.monotonic() + pause)
        else:
            self.unavailable_streak = 0

    def _note_error(self, what: str) -> None:
        self.last_error, self.last_error_at = what, datetime.now(UTC)

    async def _settle(
        self,
        ok: list[int],
        ended: list[int],
        failed: list[tuple[OutboxRow, DispatchFailure]],
    ) -> None:
        """A batch with failures: the published rows, their deliveries and each failure's
        outcome, in one transaction; the relay looks again when the first retry is due."""
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
                    if status == "pending":
                        self.wake.retry_after(outbox_db.retry_in_s(row.attempt_count))
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
        """Dispatch the row by its event type; None on success. Never raises: the outcome is
        per row."""
        try:
            # The row's trace context is the current one while it is dispatched, so the tracing
            # interceptor's StartWorkflow span (and through its headers the workflow) joins the
            # trace of the request that created the job; a row without one starts its own.
            with row_context(row):
                return await self.dispatch.row(row)
        except Exception as exc:  # a bug must not take the batch down with it
            return DispatchFailure("retry", f"{type(exc).__name__}: {str(exc)[:300]}")
