"""The webhook deliverer: claims due `webhook_delivery` rows and POSTs them, signed (Standard
Webhooks), to their endpoints. See docs/webhooks.md.

Runs as a plain loop beside the relay, both under the supervisor of the `ai-system` worker
process or `aijobs relay` (runtime/supervisor.py; docs/architecture.md "Pollers"); several may
run at once (claims are disjoint, SKIP LOCKED). A claim is fenced by the attempt number its own
UPDATE wrote: only that claim records the outcome, so no process identity is trusted for it.
Bounded: at most `max_in_flight` requests, at most one per endpoint and at most
`max_in_flight_per_user` per user per process, each under a hard time limit, so a slow or dead
receiver holds one slot, and a user whose receivers all hang holds that user's share, never another
user's turn (claims go round-robin per user, see db/webhooks.py `claim_due`); jobs never wait for a
webhook. No transaction is open during a request. Neither secrets nor bodies are logged. The same
loop purges finished rows after their retention, a bounded batch at a time, every
`purge_interval_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from activities.metrics import WorkerMetrics, worker_metrics
from activities.webhook_http import guarded_client
from db import webhook_deliveries as deliveries_db
from db import webhooks as webhooks_db
from db.listener import Listener
from db.session import SessionMaker
from db.webhook_deliveries import DeliveryRow
from db.webhooks import JOB_EVENTS
from engine.errors import EngineError
from jobs.schedules import schedule_event_body
from jobs.scope_budgets import budget_event_body
from jobs.views import Owner, find_job
from jobs.webhooks import (
    Resolver,
    UrlRefused,
    check_url,
    event_body,
    signature_header,
    signing_secrets,
    system_resolver,
)
from providers.crypto import CredentialCipher

log = logging.getLogger(__name__)
RECEIVER_TEXT_CHARS = 200
# A deployment's deliverer looks for due deliveries this often without a NOTIFY: new ones wake
# it at once, so the poll only finds retries coming due (their backoff is 30 s and more) and a
# lost notification.
POLL_INTERVAL_S = 10.0


@dataclass(frozen=True)
class WebhookConfig:
    # Failed deliveries: backoff from the base, doubling, capped at an hour, with jitter; dead
    # a day after the event (or an admin's replay), which is how long a receiver may be down.
    allow_private: bool = False
    retry_base_s: float = 30.0
    retry_max_s: float = 3600.0
    retry_for_s: float = 86_400.0
    # Without wake-ups (no listener, no `listen_url`): how often an idle deliverer claims.
    poll_interval_s: float = 1.0
    # A session URL for a listener of the deliverer's own when it is given none (a deliverer
    # run alone); None and no listener: poll only. With wake-ups, an idle deliverer sleeps
    # until the next retry comes due (or `backstop_s`): a new delivery NOTIFYs `ai_webhook`,
    # and a (re)connect of the listener tells it to look (notifications may have been lost).
    listen_url: str | None = None
    backstop_s: float = 300.0
    # Deliveries at once per deliverer: each waits at most the request timeout on a receiver.
    max_in_flight: int = 16
    # One user's share of those slots (its receivers may all hang).
    max_in_flight_per_user: int = 4
    request_timeout_s: float = 10.0
    connect_timeout_s: float = 5.0
    # A claimed row is due again after this (its deliverer died mid-request).
    lease_s: float = 60.0
    # Delivered and dead rows are deleted this long after they finished; the purge runs every
    # `purge_interval_s`, at most `purge_batches` batches of `purge_batch` rows per pass
    # (RETENTION_DAYS "webhook").
    retention_s: float = 7 * 86_400.0
    purge_interval_s: float = 300.0
    purge_batch: int = 1000
    purge_batches: int = 10
    # Names this deliverer in its log lines; unique per instance (a uuid4: a pid or a memory
    # address can come back in another process or later in this one).
    owner: str = field(
        default_factory=lambda: f"webhooks:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
    )


def http_client(config: WebhookConfig, resolve: Resolver = system_resolver) -> httpx.AsyncClient:
    """No redirects, no proxies from the environment, 10 s per request (5 s to connect); only
    public addresses unless `allow_private` (activities/webhook_http.py)."""
    return guarded_client(
        allow_private=config.allow_private,
        max_connections=config.max_in_flight * 2,
        timeout=httpx.Timeout(config.request_timeout_s, connect=config.connect_timeout_s),
        resolve=resolve,
    )


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    status_code: int | None = None
    error: str = ""
    dead: bool = False  # can never succeed (endpoint or job gone)


class WebhookDeliverer:
    def __init__(
        self,
        sessionmaker: SessionMaker,
        cipher: CredentialCipher | None,
        config: WebhookConfig,
        *,
        resolve: Resolver = system_resolver,
        clock: Callable[[], float] = time.time,
        metrics: WorkerMetrics | None = None,
        listener: Listener | None = None,
    ) -> None:
        self._sm = sessionmaker
        self._cipher = cipher
        self.config = config
        self._resolve = resolve
        self._clock = clock
        self._metrics = metrics or worker_metrics()
        self._busy: dict[uuid.UUID, int] = {}  # endpoint → requests in flight
        self._busy_users: dict[str, int] = {}  # user → requests in flight
        self._next_purge = time.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()  # a new delivery was committed, or a slot came free
        self._client: httpx.AsyncClient | None = None
        self._listener = listener
        self._due_in_s: float | None = None  # from the last claim: the next row's due time
        self.attempts = 0  # requests made (tests)

    def on_delivery(self, payload: str | None) -> None:
        """`ai_webhook` (a new delivery was committed) or MISSED: claim now."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and deliver until `stop` is set; requests in flight then get their time limit
        to finish (their rows are retried after the lease otherwise)."""
        failures = 0
        self._client = http_client(self.config, self._resolve)
        listener, own = self._listener, False
        if listener is None and self.config.listen_url:  # run alone: a listener of its own
            listener, own = Listener(self.config.listen_url), True
        stop_listening = (
            listener.on(deliveries_db.NOTIFY_CHANNEL, self.on_delivery) if listener else None
        )
        if own and listener is not None:
            listener.start()
        try:
            while not stop.is_set():
                await self._maybe_purge()
                self._wake.clear()
                try:
                    claimed = await self.run_once()
                    failures = 0
                except Exception:
                    failures += 1
                    log.warning(
                        "webhook claim failed (%d in a row); backing off",
                        failures,
                        extra={"deliverer": self.config.owner},
                    )
                    await _sleep_or_stop(stop, min(5.0, 0.2 * 2**failures))
                    continue
                if not claimed:
                    await self._idle(stop, listening=listener is not None)
        finally:
            if stop_listening is not None:
                stop_listening()
            if own and listener is not None:
                await listener.close()
            if self._tasks:
                _, pending = await asyncio.wait(
                    list(self._tasks), timeout=self.config.request_timeout_s + 2
                )
                for task in pending:
                    task.cancel()
            await self._client.aclose()

    async def run_once(self) -> int:
        """Claim what the free slots allow and start those deliveries; returns how many."""
        free = self.config.max_in_flight - len(self._tasks)
        if free <= 0:
            return 0
        async with self._sm.begin() as s:
            rows = await deliveries_db.claim_share(
                s,
                limit=free,
                busy_endpoints=list(self._busy),
                busy_users=self._busy_users,
                per_user=self.config.max_in_flight_per_user,
                lease_s=self.config.lease_s,
            )
            if len(rows) < free:  # about to idle: until when
                self._due_in_s = await deliveries_db.next_due_in_s(s)
        for row in rows:
            self._busy[row.endpoint_id] = self._busy.get(row.endpoint_id, 0) + 1
            self._busy_users[row.user_id] = self._busy_users.get(row.user_id, 0) + 1
            task = asyncio.create_task(self._deliver(row), name=f"webhook:{row.id}")
            self._tasks.add(task)
            task.add_done_callback(self._done)
        return len(rows)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._wake.set()  # a slot came free: claim again without waiting for the poll

    def idle_for_s(self, *, listening: bool) -> float:
        """How long an idle deliverer waits for a wake-up: without one, the poll interval;
        with one, until the next row comes due (a retry, a lease another deliverer let lapse),
        at most `backstop_s`, or the poll interval while rows are due that it could not take.
        The retention purge keeps its own time."""
        due_in = self._due_in_s
        if not listening or (due_in is not None and due_in <= 0):
            # No wake-ups, or rows due now that this claim could not take (their users' shares
            # or endpoints are busy elsewhere: a slot freed there wakes no one here).
            return self.config.poll_interval_s
        wait = self.config.backstop_s if due_in is None else min(self.config.backstop_s, due_in)
        return max(0.0, min(wait, self._next_purge - time.monotonic() + 0.05))

    async def _idle(self, stop: asyncio.Event, *, listening: bool) -> None:
        """Wait for a NOTIFY of a new delivery, a freed slot, the stop, or `idle_for_s`,
        whichever comes first."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(
                waits,
                timeout=self.idle_for_s(listening=listening),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            for w in waits:
                w.cancel()

    async def _deliver(self, row: DeliveryRow) -> None:
        try:
            try:
                outcome = await self._attempt(row)
            except Exception as exc:  # a bug must not lose the row: it is retried
                outcome = Outcome(False, error=f"internal: {type(exc).__name__}")
            await self._record(row, outcome)
        except Exception:
            # The database is away: the claim's lease makes the row due again.
            log.warning("webhook outcome not recorded", extra={"delivery_id": row.id})
        finally:
            _release(self._busy, row.endpoint_id)
            _release(self._busy_users, row.user_id)

    async def purge(self) -> int:
        """Delete finished rows older than the retention, in bounded batches (one transaction
        each, so a long purge never holds locks the claims need); returns how many."""
        total = 0
        for _ in range(self.config.purge_batches):
            async with self._sm.begin() as s:
                n = await deliveries_db.purge_finished(
                    s, older_than_s=self.config.retention_s, limit=self.config.purge_batch
                )
            total += n
            if n < self.config.purge_batch:
                break
        return total

    async def _maybe_purge(self) -> None:
        if time.monotonic() < self._next_purge:
            return
        self._next_purge = time.monotonic() + self.config.purge_interval_s
        try:
            n = await self.purge()
        except Exception:  # the database is away: the next pass tries again
            log.warning("webhook retention purge failed")
            return
        if n:
            log.info("webhook deliveries purged", extra={"count": n})

    async def _attempt(self, row: DeliveryRow) -> Outcome:
        async with self._sm() as s:
            endpoint = await webhooks_db.get_endpoint(s, row.endpoint_id)
            # A schedule's or a budget's event carries its own payload (jobs/schedules.py,
            # jobs/scope_budgets.py), not a job.
            schedule_event = await schedule_event_body(s, row) or await budget_event_body(s, row)
            # Read as the endpoint's owner sees it: a webhook carries only its owner's job.
            job = (
                None
                if schedule_event or row.event_type not in JOB_EVENTS
                else await find_job(s, uuid.UUID(row.job_id), Owner(row.user_id))
            )
        if endpoint is None or endpoint.deleted_at is not None:
            return Outcome(False, error="endpoint deleted", dead=True)
        if job is None and schedule_event is None:
            return Outcome(False, error="job not found", dead=True)
        if self._cipher is None:
            return Outcome(False, error="no encryption key is set")
        try:
            secrets = signing_secrets(self._cipher, endpoint)
            # The URL's shape here; its addresses are checked by the connection itself.
            await check_url(endpoint.url, allow_private=self.config.allow_private, resolve=None)
        except EngineError as exc:
            return Outcome(False, error=exc.code, dead=isinstance(exc, UrlRefused))
        body = json.dumps(
            event_body(row.event_type, row.occurred_at, job.view()) if job else schedule_event,
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode()
        timestamp = int(self._clock())
        headers = {
            "content-type": "application/json",
            "user-agent": "ai-job-engine-webhooks/1",
            "webhook-id": row.webhook_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signature_header(secrets, row.webhook_id, timestamp, body),
        }
        del secrets
        assert self._client is not None
        self.attempts += 1
        try:
            async with asyncio.timeout(self.config.request_timeout_s):
                async with self._client.stream(
                    "POST", endpoint.url, content=body, headers=headers
                ) as resp:
                    if 200 <= resp.status_code < 300:
                        return Outcome(True, resp.status_code)
                    text = await _head_text(resp)
                    return Outcome(False, resp.status_code, f"HTTP {resp.status_code}: {text}")
        except TimeoutError:
            return Outcome(False, error="timeout")
        except httpx.HTTPError as exc:
            return Outcome(False, error=f"{type(exc).__name__}: {str(exc)[:120]}")

    async def _record(self, row: DeliveryRow, outcome: Outcome) -> None:
        async with self._sm.begin() as s:
            if outcome.delivered:
                recorded = await deliveries_db.mark_delivered(
                    s, row.id, attempt=row.attempt_count, status_code=outcome.status_code or 200
                )
                status = "delivered" if recorded else "lost"
            elif outcome.dead:
                await deliveries_db.mark_dead(
                    s, row.id, attempt=row.attempt_count, error=outcome.error
                )
                status = "dead"
            else:
                status = (
                    await deliveries_db.mark_attempt_failed(
                        s,
                        row.id,
                        attempt=row.attempt_count,
                        status_code=outcome.status_code,
                        error=outcome.error,
                        retry_in_s=self.backoff_s(row.attempt_count),
                        retry_for_s=self.config.retry_for_s,
                    )
                    or "lost"
                )
        # "lost": the lease expired and another claim owns the row; that claim counts it.
        self._metrics.webhook_delivered(status)
        level = logging.INFO if outcome.delivered else logging.WARNING
        log.log(
            level,
            "webhook delivery %s",
            status,
            extra={
                "delivery_id": row.id,
                "deliverer": self.config.owner,
                "webhook_endpoint": str(row.endpoint_id),
                "job_id": row.job_id,
                "attempt": row.attempt_count,
                "status_code": outcome.status_code,
            },
        )

    def backoff_s(self, attempt: int) -> float:
        """base * 2^(attempt-1), capped, times a jitter in [0.75, 1.25)."""
        c = self.config
        delay = min(c.retry_max_s, c.retry_base_s * 2 ** min(max(attempt - 1, 0), 30))
        return float(delay * (0.75 + random.random() * 0.5))


def _release(counts: dict[Any, int], key: Any) -> None:
    left = counts.get(key, 1) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


async def _head_text(resp: httpx.Response) -> str:
    """At most the first 200 characters of the receiver's answer, on one line."""
    chunk = b""
    async for part in resp.aiter_bytes():
        chunk += part
        if len(chunk) >= RECEIVER_TEXT_CHARS * 4:
            break
    text = chunk.decode("utf-8", errors="replace")[:RECEIVER_TEXT_CHARS]
    return " ".join(text.split())


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
