"""The cluster-wide limits' statements on the real database: a user's request bucket (one
atomic take, shared by every caller), the lease rows of a per-user cap (exact under concurrency,
lapsing when not renewed), and the webhook deliverers' per-user share across deliverers."""

from __future__ import annotations

import asyncio
import uuid

from db import caps as caps_db
from db import rate_limits as rate_db
from db import webhook_deliveries as deliveries_db
from db.session import SessionMaker
from tests.integration.engine_helpers import execute, scalar
from tests.webhook_helpers import fanned_out


async def test_a_bucket_grants_its_burst_at_once_then_refuses_with_the_refill_time(
    db: SessionMaker,
) -> None:
    # 60 a minute: one a second. Twenty concurrent takes against a burst of 5.
    takes = await asyncio.gather(
        *(rate_db.take(db, "flooder", per_minute=60, burst=5) for _ in range(20))
    )
    granted = [t for t in takes if t.granted]
    # Exactly the burst, give or take what refilled while the takes ran (one a second).
    assert 5 <= len(granted) <= 6, len(granted)
    refused = [t for t in takes if not t.granted]
    assert refused and all(t.retry_after_s >= 1 for t in refused)
    # Another user's bucket is its own.
    assert (await rate_db.take(db, "other", per_minute=60, burst=5)).granted
    # Time passes (the row's clock is moved back 3 s): three more, then refused again.
    await execute(
        db,
        "UPDATE api_rate_bucket SET tokens = 0, refilled_at = now() - interval '3 seconds' "
        "WHERE user_id = 'flooder'",
    )
    later = [await rate_db.take(db, "flooder", per_minute=60, burst=5) for _ in range(4)]
    assert [t.granted for t in later[:3]] == [True, True, True]
    assert not later[3].granted and later[3].retry_after_s == 1
    # A bucket never fills past its burst, however long the user was away.
    await execute(
        db, "UPDATE api_rate_bucket SET refilled_at = now() - interval '1 day' WHERE true"
    )
    await rate_db.take(db, "flooder", per_minute=60, burst=5)
    assert await scalar(db, "SELECT tokens FROM api_rate_bucket WHERE user_id = 'flooder'") == 4


def test_retry_after_is_whole_seconds_until_one_request_refills() -> None:
    assert rate_db.retry_after(0.0, 600) == 1  # 10 a second
    assert rate_db.retry_after(0.5, 60) == 1
    assert rate_db.retry_after(0.0, 6) == 10
    assert rate_db.retry_after(-0.0, 1) == 60


async def test_cap_leases_are_exact_under_concurrency_and_lapse_unless_renewed(
    db: SessionMaker,
) -> None:
    async def take(holder: str, ttl_s: float = 30.0) -> uuid.UUID | None:
        return await caps_db.take(db, "stream", "alice", cap=3, holder=holder, ttl_s=ttl_s)

    # Ten takers on two "processes" at once: exactly three leases.
    got = await asyncio.gather(*(take(f"p{i % 2}") for i in range(10)))
    held = [g for g in got if g is not None]
    assert len(held) == 3
    assert await caps_db.take(db, "stream", "bob", cap=3, holder="p0", ttl_s=30) is not None
    # A released lease frees its slot at once.
    await caps_db.release(db, held[0])
    assert (again := await take("p1")) is not None
    assert await take("p1") is None
    # A process that died stops renewing: its leases lapse, the survivor's are renewed.
    lapse = "UPDATE cap_lease SET expires_at = now() - interval '1 second' WHERE id = :id"
    await execute(db, lapse, id=held[1])
    assert await caps_db.renew(db, [held[1], held[2], again], ttl_s=30) == {held[2], again}
    assert await take("p0") is not None  # the lapsed slot is taken again
    assert await take("p0") is None


async def test_a_users_webhook_share_holds_across_deliverers(db: SessionMaker) -> None:
    await fanned_out(db, "user-a", endpoints=6, jobs=2)  # 12 rows over 6 endpoints
    claim = {"limit": 16, "busy_endpoints": [], "busy_users": {}, "per_user": 4, "lease_s": 60.0}
    # Two deliverers (sessions), one after the other, neither knowing the other's rows.
    async with db.begin() as s1:
        first = await deliveries_db.claim_share(s1, **claim)  # type: ignore[arg-type]
    async with db.begin() as s2:
        second = await deliveries_db.claim_share(s2, **claim)  # type: ignore[arg-type]
    assert len(first) == 4 and second == []
    # One ends (delivered): its slot is free for any deliverer.
    async with db.begin() as s:
        assert await deliveries_db.mark_delivered(
            s, first[0].id, attempt=first[0].attempt_count, status_code=200
        )
    async with db.begin() as s2:
        third = await deliveries_db.claim_share(s2, **claim)  # type: ignore[arg-type]
    assert len(third) == 1
    # A deliverer that died: its claims' leases expire and the share comes back.
    await execute(
        db,
        "UPDATE webhook_delivery SET next_attempt_at = now() - interval '1 second', "
        "claimed_until = now() - interval '1 second' WHERE status = 'pending'",
    )
    async with db.begin() as s:
        fourth = await deliveries_db.claim_share(s, **claim)  # type: ignore[arg-type]
    assert len(fourth) == 4
