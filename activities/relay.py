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
relay's own:
- `ai_outbox` (a create's enqueue, a bulk start, a requeue, a job event someone waits for):
  claim at once. Nothing holds this wake-up back.
- `ai_job_changed` (every job state change): only while the last claim left enqueue rows held by
  their users' dispatch windows (a job's end may make room), and then at most once per
  `job_wake_s`; otherwise it costs nothing.
- A row this relay failed to dispatch: when its backoff ends.
- The poll (`RELAY_POLL_INTERVAL_S`): the backstop for rows nothing woke the relay for (a job
  event no one waits for, a claim another relay let expire). The expired claims are put back
  and the held rows of ended jobs closed inside a claim's own transaction, every
  `release_every_s`.
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
from activities.relay_dispatch import (
    KNOWN_DOMAIN_EVENTS,
    Dispatch,
    DispatchFailure,
    event_label,
)
from db import outbox as outbox_db
from db import relay as relay_db
from db import webhook_deliveries as deliveries_db
from db.lifecycle import JOB_CHANGED_CHANNEL
from db.listener import Listener
from db.outbox import ENQUEUE, NOTIFY_CHANNEL, OutboxRow
from db.session import SessionMaker
from jobs.spec import Catalog

log = logging.getLogger(__name__)
__all__ = ["KNOWN_DOMAIN_EVENTS", "DispatchFailure", "Relay", "RelayConfig"]


@dataclass(frozen=True)
class RelayConfig:
    database_url: str
    task_queue_suffix: str = ""
    poll_interval_s: float = 30.0
    lock_ttl_s: float = 60.0
    batch_size: int = 100
    max_in_flight: int = 64
    release_every_s: float = 15.0
    # Attach the jobs' fairness keys when starting their workflows.
    fairness: bool = True
    # A job created while its user had at most `light_jobs` active jobs (itself included) is
    # dispatched with `light_boost` times its user's weight: a user with a few jobs goes ahead
    # of another user's backlog instead of taking turns with it. 0 turns it off.
    light_jobs: int = 4
    light_boost: float = 8.0
    # USER_DISPATCH_WINDOW: a user's jobs dispatched and not yet ended, at most; the user's
    # further jobs wait in the outbox and go out in the user's priority order (db/relay.py).
    user_window: int = relay_db.DEFAULT_WINDOW
    # While rows are held, a job's change (its end makes room in a window) wakes the relay at
    # most this often; the outbox's own NOTIFY and the poll are never held back by it.
    job_wake_s: float = 0.2
    # While a batch is being dispatched, a wake-up claims at most this long after the last
    # claim (none in flight: at once).
    busy_claim_s: float = 0.025
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
        self.dispatch = Dispatch(client, catalog, config, self._metrics)
        self._listener = listener
        self.unavailable_streak = 0
        # Progress, for the relay activity's heartbeat: rows settled, batches, the last batch's
        # size and wall time, the last failure's type or kind and its time.
        self.dispatched = self.batches = self.last_batch = 0
        self.last_batch_at: datetime | None = None
        self.last_error: str | None = None
        self.last_error_at: datetime | None = None
        # Wake-ups, recorded by the listener's handlers (they run on the listener's task).
        self._kick = asyncio.Event()
        self._claim_now = True  # an outbox NOTIFY (or a possible miss) since the last claim
        self._job_changed = False  # a job changed since the last claim
        self.holding = False  # the last claim left enqueue rows held by their windows
        self._last_claim = 0.0  # monotonic time of the last claim
        self._last_release = 0.0
        self._retry_at: float | None = None  # when a row this relay failed comes due again
        # Batches being dispatched (each in its task), the rows in them, and until when the
        # relay claims nothing (Temporal unreachable).
        self._batches: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._room_before_claim = config.batch_size
        self._paused_until = 0.0

    @property
    def started(self) -> int:
        """Workflows this relay started (tests and metrics)."""
        return self.dispatch.started

    # ---- wake-ups ------------------------------------------------------------------------

    def on_outbox(self, payload: str | None) -> None:
        """`ai_outbox`, or MISSED on any channel: claim at once."""
        self._claim_now = True
        self._kick.set()

    def on_job_changed(self, payload: str | None) -> None:
        if payload is None:
            self.on_outbox(payload)
        elif self.holding:  # else nothing waits for room: the change costs nothing
            self._job_changed = True
            self._kick.set()

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
                try:
                    if await self._claim_and_spawn() >= self._room_before_claim:
                        continue  # a full claim: more may be due
                    failures = 0
                except Exception as exc:
                    # Keep the relay alive and back off. Rows claimed but not marked stay
                    # `processing` until their TTL, then go out again; starting a workflow
                    # twice is a no-op.
                    failures += 1
                    self._claim_now = True
                    self._note_error(type(exc).__name__)
                    log.warning("relay iteration failed (%d in a row); backing off", failures)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), min(5.0, 0.2 * 2**failures))
                    continue
                await self._wait(stop)
        finally:
            stop_listening()
            if self._batches:  # the batches in hand are finished and settled
                await asyncio.gather(*self._batches, return_exceptions=True)
            if own:
                await listener.close()

    async def _claim_and_spawn(self) -> int:
        """A claim of what the free dispatch slots allow (none while Temporal is known to be
        unreachable), its batch dispatched in a task; how many rows it claimed."""
        room = self.config.max_in_flight - self._in_flight
        self._room_before_claim = max(1, min(self.config.batch_size, room))
        if room <= 0 or time.monotonic() < self._paused_until:
            self._claim_now = True  # rows may be due: claim once that ends
            return 0
        rows = await self.claim(limit=self._room_before_claim)
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
        self._kick.set()  # room for the next claim

    async def _wait(self, stop: asyncio.Event) -> None:
        """Until an outbox wake-up, a job change while rows are held (not before `job_wake_s`
        after the last claim), the next retry, the poll interval or the stop; while Temporal
        is unreachable or the dispatch slots are full, until that ends."""
        end = time.monotonic() + self.config.poll_interval_s
        if self._retry_at is not None:
            end = min(end, self._retry_at)
        while not stop.is_set():
            now = time.monotonic()
            blocked = now < self._paused_until or self._in_flight >= self.config.max_in_flight
            # While batches are being dispatched, claims come at most every `busy_claim_s`:
            # what arrives meanwhile goes out together (a burst costs a claim per interval,
            # not one per create), and never waits for a slow batch to end.
            coalesce_until = self._last_claim + self.config.busy_claim_s if self._batches else 0
            if self._claim_now and not blocked and now >= coalesce_until:
                return
            wake_at = max(end, self._paused_until) if blocked else end
            if self._claim_now and not blocked:
                wake_at = min(wake_at, coalesce_until)
            if self._job_changed and not blocked:
                if self.holding:
                    wake_at = min(end, self._last_claim + self.config.job_wake_s)
                else:
                    self._job_changed = False
            if now >= wake_at:
                return
            self._kick.clear()
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._kick.wait())]
            try:
                await asyncio.wait(
                    waits, timeout=wake_at - now, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for w in waits:
                    w.cancel()

    # ---- one batch -------------------------------------------------------------------

    async def claim(self, limit: int | None = None) -> list[OutboxRow]:
        """One batch (at most `limit`, else `batch_size` rows), claimed in one round trip
        (BEGIN, the claim and COMMIT pipelined), with the expired claims put back first every
        `release_every_s`."""
        now = time.monotonic()
        release = now - self._last_release >= self.config.release_every_s
        self._claim_now = self._job_changed = False
        self._last_claim = now
        if self._retry_at is not None and now >= self._retry_at:
            self._retry_at = None
        got = await relay_db.claim_batch(
            self._sm,
            owner=self.config.owner,
            limit=limit or self.config.batch_size,
            window=self.config.user_window,
            release_ttl_s=self.config.lock_ttl_s if release else None,
        )
        if release:
            self._last_release = now
        self.holding = got.holding
        if got.released:
            log.warning("released %d expired outbox claims", got.released)
        if got.closed:
            log.info("closed %d held enqueue rows of jobs that ended while held", got.closed)
        return got.rows

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
        pause = self._paused_until - time.monotonic()
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
            pause = min(5.0, 0.25 * 2**self.unavailable_streak)
            self._paused_until = max(self._paused_until, time.monotonic() + pause)
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
                        self._retry_after(outbox_db.retry_in_s(row.attempt_count))
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

    def _retry_after(self, seconds: float) -> None:
        at = time.monotonic() + seconds
        self._retry_at = at if self._retry_at is None else min(self._retry_at, at)

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
