"""Webhook delivery is fair across users, on a real PostgreSQL with real HTTP receivers on
127.0.0.1: one user's receivers that accept and never answer hold at most that user's share of a
deliverer's slots, and another user's delivery goes out at once; claims stay disjoint between
deliverers; finished rows are purged after their retention; the outcome counter moves.

Jobs and published domain events are written straight to SQL (the relay's part is tested
elsewhere); the fan-out and everything after it is the production code."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from activities.metrics import WorkerMetrics
from activities.webhooks import WebhookConfig, WebhookDeliverer
from db import webhook_deliveries as webhooks_db
from db.session import SessionMaker
from tests.integration.engine_helpers import execute, insert_job, rows, scalar
from tests.support import eventually
from tests.webhook_helpers import (
    CIPHER,
    closed_port,
    fanned_out,
    publish_completed,
    receiver,
    running,
    service,
    statuses,
    verified_by,
)

HANG_ENDPOINTS = 30
HANG_JOBS = 5


@dataclass
class Hanging:
    """An HTTP server that accepts every connection, reads what it is sent and never answers."""

    url: str = ""
    accepted: int = 0
    open_now: int = 0
    most_open: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    def hang_up(self) -> None:
        """Close every connection: the requests still waiting fail at once."""
        for w in self.writers:
            w.close()


@contextlib.asynccontextmanager
async def hanging_server() -> AsyncIterator[Hanging]:
    state = Hanging()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.accepted += 1
        state.open_now += 1
        state.most_open = max(state.most_open, state.open_now)
        state.writers.append(writer)
        try:
            while await reader.read(65536):
                pass  # read and never reply
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            state.open_now -= 1

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield state
    finally:
        state.hang_up()
        server.close()
        await server.wait_closed()


FAIR = WebhookConfig(
    allow_private=True,
    poll_interval_s=0.05,
    max_in_flight=16,
    max_in_flight_per_user=4,
    request_timeout_s=10.0,
    connect_timeout_s=5.0,
)


async def test_a_user_with_hanging_receivers_does_not_delay_another_users_delivery(
    db: SessionMaker,
) -> None:
    svc = service(db)
    async with hanging_server() as hang:
        with receiver() as prompt:
            for i in range(HANG_ENDPOINTS):
                await svc.create("user-a", f"{hang.url}/hook/{i}", None)
            for _ in range(HANG_JOBS):
                await publish_completed(db, await insert_job(db, "user-a"))
            _, secret = await svc.create("user-b", prompt.url, None)
            await publish_completed(db, await insert_job(db, "user-b"))
            # A's rows are older than B's one: a FIFO claim serves A's backlog first.
            assert await scalar(db, "SELECT count(*) FROM webhook_delivery") == (
                HANG_ENDPOINTS * HANG_JOBS + 1
            )

            d = WebhookDeliverer(db, CIPHER, FAIR, metrics=WorkerMetrics(CollectorRegistry()))
            started = time.monotonic()
            async with running(d):
                [req] = await prompt.wait_for(1, timeout=FAIR.request_timeout_s + 5)
                waited = time.monotonic() - started
                # Well before any of A's requests could have timed out and freed a slot.
                assert waited < FAIR.request_timeout_s / 4, waited
                assert verified_by(secret, req)

                async def b_delivered() -> bool:
                    return await statuses(db, "user-b") == ["delivered"]

                await eventually(b_delivered, what="B's delivery recorded")

                # A's hanging receivers hold exactly A's share of the 16 slots, no more.
                async def a_share_taken() -> bool:
                    return hang.open_now == FAIR.max_in_flight_per_user

                await eventually(a_share_taken, what=lambda: f"{hang.open_now} of A's open")
                assert hang.most_open == FAIR.max_in_flight_per_user
                hang.hang_up()  # the deliverer then stops without waiting out 10 s timeouts


async def test_concurrent_claims_are_disjoint_fair_and_a_dead_claims_rows_come_back(
    db: SessionMaker,
) -> None:
    await fanned_out(db, "user-a", endpoints=6, jobs=3)  # 18 rows, older
    await fanned_out(db, "user-b", endpoints=1, jobs=2)  # 2 rows, newer
    claim = {"limit": 16, "busy_endpoints": [], "per_user": 4, "lease_s": 60.0}
    async with db.begin() as s1, db.begin() as s2:
        first = await webhooks_db.claim_due(s1, busy_users={}, **claim)  # type: ignore[arg-type]
        # The second deliverer claims while the first still holds its rows (SKIP LOCKED).
        second = await webhooks_db.claim_due(s2, busy_users={}, **claim)  # type: ignore[arg-type]
    ids1, ids2 = {r.id for r in first}, {r.id for r in second}
    assert ids1 and ids2 and not ids1 & ids2
    for batch in (first, second):
        per_user = [r.user_id for r in batch]
        assert per_user.count("user-a") <= 4 and per_user.count("user-b") <= 1
        assert len({r.endpoint_id for r in batch}) == len(batch)  # one per endpoint
    # B, whose rows are newer than all of A's, is served by the first claim.
    assert "user-b" in {r.user_id for r in first}
    # A user's own in-flight requests count against its share.
    async with db.begin() as s:
        third = await webhooks_db.claim_due(s, busy_users={"user-a": 4}, **claim)  # type: ignore[arg-type]
    assert {r.user_id for r in third} <= {"user-b"}

    # A deliverer that died holding its claims: after the lease they are claimed again.
    claimed = ids1 | ids2 | {r.id for r in third}
    await execute(
        db,
        "UPDATE webhook_delivery SET next_attempt_at = now() WHERE id = ANY(:ids)",
        ids=list(claimed),
    )
    async with db.begin() as s:
        again = await webhooks_db.claim_due(s, busy_users={}, **claim)  # type: ignore[arg-type]
    reclaimed = [r for r in again if r.id in claimed]
    assert reclaimed and all(r.attempt_count == 2 for r in reclaimed)


async def scalar_ids(db: SessionMaker, sql: str) -> list[int]:
    return [int(r.id) for r in await rows(db, sql)]


async def test_finished_deliveries_are_purged_after_retention_in_bounded_batches(
    db: SessionMaker,
) -> None:
    await fanned_out(db, "user-a", endpoints=1, jobs=9)
    ids = await scalar_ids(db, "SELECT id FROM webhook_delivery ORDER BY id")
    old_delivered, old_dead = ids[0:3], ids[3:5]
    recent_delivered, recent_dead = ids[5:6], ids[6:7]
    old_pending, old_failed = ids[7:8], ids[8:9]
    for status, when, group in (
        ("delivered", "now() - interval '8 days'", old_delivered),
        ("dead", "now() - interval '8 days'", old_dead),
        ("delivered", "now() - interval '1 day'", recent_delivered),
        ("dead", "now() - interval '1 day'", recent_dead),
    ):
        await execute(
            db,
            f"UPDATE webhook_delivery SET status = :st, finished_at = {when} WHERE id = ANY(:ids)",
            st=status,
            ids=group,
        )
    # Undelivered rows are never purged, however old.
    await execute(
        db,
        "UPDATE webhook_delivery SET created_at = now() - interval '30 days', "
        "status = CASE WHEN id = :failed THEN 'failed' ELSE status END WHERE id = ANY(:ids)",
        failed=old_failed[0],
        ids=old_pending + old_failed,
    )
    config = WebhookConfig(retention_s=7 * 86_400, purge_batch=2, purge_batches=1)
    d = WebhookDeliverer(db, CIPHER, config, metrics=WorkerMetrics(CollectorRegistry()))
    assert await d.purge() == 2  # one batch of two per pass
    assert await d.purge() == 2
    assert await d.purge() == 1
    assert await d.purge() == 0
    left = await scalar_ids(db, "SELECT id FROM webhook_delivery ORDER BY id")
    assert left == sorted(recent_delivered + recent_dead + old_pending + old_failed)


async def test_the_outcome_counter_moves_for_delivered_failed_and_dead(db: SessionMaker) -> None:
    svc = service(db)
    metrics = WorkerMetrics(CollectorRegistry())

    def count(status: str) -> float:
        return float(metrics.webhook_deliveries.labels(status)._value.get())

    assert (count("delivered"), count("failed"), count("dead")) == (0, 0, 0)
    with receiver() as ok:
        await svc.create("user-a", ok.url, None)
        await svc.create("user-b", f"http://127.0.0.1:{closed_port()}/x", None)
        gone, _ = await svc.create("user-c", ok.url + "/gone", None)
        for user in ("user-a", "user-b", "user-c"):
            await publish_completed(db, await insert_job(db, user))
        # Deleted behind the deliverer's back: its delivery can never succeed.
        await execute(
            db, "UPDATE webhook_endpoint SET deleted_at = now() WHERE id = :id", id=gone.id
        )
        config = WebhookConfig(allow_private=True, poll_interval_s=0.05, retry_base_s=60)
        async with running(WebhookDeliverer(db, CIPHER, config, metrics=metrics)):

            async def all_counted() -> bool:
                return (count("delivered"), count("failed"), count("dead")) == (1, 1, 1)

            await eventually(
                all_counted,
                what=lambda: f"{(count('delivered'), count('failed'), count('dead'))}",
            )
        assert len(ok.requests) == 1
    assert await statuses(db, "user-b") == ["failed"]
    assert await statuses(db, "user-c") == ["dead"]
