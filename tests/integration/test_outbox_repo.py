"""The transactional outbox on a real PostgreSQL: concurrent claimers never
share a row, only the claimer marks its rows, failures back off and end `dead` after 3 attempts,
the one operator requeue gives parked rows fresh attempts (keeping their error), a dead
claimer's rows come back after the TTL (the crash window), and the dedupe key makes a second
insert a no-op."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools

from sqlalchemy import text

from db import outbox as outbox_db
from db import outbox_admin as outbox_admin_db
from db import pipeline
from db import relay as relay_db
from db.outbox import ENQUEUE, MAX_ATTEMPTS, OutboxRow
from db.session import SessionMaker


async def seed(sm: SessionMaker, n: int) -> list[int]:
    """n pending enqueue rows, inserted set-based (the insert path is tested on its own)."""
    async with sm.begin() as s:
        rows = await s.execute(
            text(
                """
                INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key,
                                          payload, status, attempt_count, available_at)
                SELECT :ev, 'AiJob', 'job-' || g, 'synthetic:u1:' || g,
                       jsonb_build_object('n', g), 'pending', 0, now()
                FROM generate_series(1, :n) AS g
                RETURNING id
                """
            ),
            {"n": n, "ev": ENQUEUE},
        )
        return sorted(r.id for r in rows)


async def rows(sm: SessionMaker, ids: list[int] | None = None) -> dict[int, OutboxRow]:
    async with sm() as s:
        result = await s.execute(
            text(
                "SELECT id, event_type, aggregate_type, aggregate_id, dedupe_key, payload, status, "
                "attempt_count, available_at, locked_by, locked_at, last_error, published_at, "
                "created_at FROM outbox_event "
                "WHERE CAST(:ids AS bigint[]) IS NULL OR id = ANY(:ids)"
            ),
            {"ids": ids},
        )
        return {r.id: OutboxRow(**r._mapping) for r in result}


async def claim(sm: SessionMaker, owner: str, limit: int) -> list[OutboxRow]:
    return await relay_db.claim(sm, owner=owner, limit=limit)


async def make_claimable(sm: SessionMaker, ids: list[int]) -> None:
    """Skip a backoff: the next attempt is due now (time travel instead of waiting)."""
    async with sm.begin() as s:
        await s.execute(
            text("UPDATE outbox_event SET available_at = now() WHERE id = ANY(:ids)"), {"ids": ids}
        )


# ---- claim ----------------------------------------------------------------------------------


async def test_concurrent_claimers_claim_every_row_exactly_once(db: SessionMaker) -> None:
    ids = await seed(db, 1000)
    owners = [f"relay-{i}" for i in range(4)]

    async def claimer(owner: str) -> list[int]:
        got: list[int] = []
        while batch := await claim(db, owner, 37):
            assert all(r.status == "processing" and r.locked_by == owner for r in batch)
            got.extend(r.id for r in batch)
        return got

    claimed = await asyncio.gather(*(claimer(o) for o in owners))
    assert sorted(itertools.chain.from_iterable(claimed)) == ids  # union, no duplicates
    for a, b in itertools.combinations(claimed, 2):
        assert not set(a) & set(b)
    assert sum(1 for c in claimed if c) >= 2  # the claimers really ran side by side
    final = await rows(db)
    for owner, mine in zip(owners, claimed, strict=True):
        for event_id in mine:
            r = final[event_id]
            assert (r.status, r.locked_by, r.attempt_count) == ("processing", owner, 1)
            assert r.locked_at is not None
    assert await claim(db, "relay-late", 10) == []


async def test_a_claim_skips_rows_another_open_claim_holds(db: SessionMaker) -> None:
    """While relay A's claim transaction is still open, relay B gets the other rows at once
    instead of waiting for A's row locks (SKIP LOCKED; lock_timeout turns a wait into an error)."""
    ids = await seed(db, 10)
    # A's claim is the relay's statement in a transaction left open; B claims as the relay does.
    async with pipeline.transaction(db) as a:
        [rows_a] = await a.run([(relay_db.CLAIM, {"lim": 5, "owner": "relay-a", "window": 4})])
        held = sorted((OutboxRow(**r) for r in rows_a), key=lambda r: r.id)
        assert [r.id for r in held] == ids[:5]
        # A wait for A's row locks would never end while A is open: a timeout turns it into
        # an error.
        other = await asyncio.wait_for(claim(db, "relay-b", 5), timeout=5)
        assert [r.id for r in other] == ids[5:]
        await a.commit()
    assert {r.locked_by for r in (await rows(db)).values()} == {"relay-a", "relay-b"}


async def test_claim_respects_available_at_and_order(db: SessionMaker) -> None:
    ids = await seed(db, 3)
    async with db.begin() as s:
        await s.execute(
            text("UPDATE outbox_event SET available_at = now() + interval '1 hour' WHERE id = :id"),
            {"id": ids[0]},
        )
    assert [r.id for r in await claim(db, "relay-a", 10)] == ids[1:]


# ---- publish / fail / dead ------------------------------------------------------------------


async def test_mark_published_only_touches_the_claimers_processing_rows(db: SessionMaker) -> None:
    ids = await seed(db, 6)
    mine = [r.id for r in await claim(db, "relay-a", 3)]
    theirs = [r.id for r in await claim(db, "relay-b", 2)]
    pending = sorted(set(ids) - set(mine) - set(theirs))
    assert len(pending) == 1

    async with db.begin() as s:
        assert await outbox_db.mark_published(s, ids, owner="relay-a") == 3
    after = await rows(db)
    for i in mine:
        assert after[i].status == "published" and after[i].published_at is not None
        assert after[i].locked_by is None and after[i].locked_at is None
    for i in theirs:
        assert (after[i].status, after[i].locked_by) == ("processing", "relay-b")
    assert after[pending[0]].status == "pending"

    async with db.begin() as s:
        assert await outbox_db.mark_published(s, mine, owner="relay-a") == 0  # already published
        assert await outbox_db.mark_published(s, [], owner="relay-a") == 0
    assert await rows(db, mine) == {i: after[i] for i in mine}


async def test_mark_failed_backs_off_then_parks_as_failed_then_requeued(db: SessionMaker) -> None:
    (event_id,) = await seed(db, 1)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        (row,) = await claim(db, "relay-a", 10)
        assert (row.id, row.attempt_count) == (event_id, attempt)
        async with db.begin() as s:
            # Another relay cannot fail a row it does not hold.
            assert (
                await outbox_db.mark_failed(s, event_id, owner="relay-b", error="not mine") is None
            )
            status = await outbox_db.mark_failed(
                s, event_id, owner="relay-a", error=f"start failed #{attempt}", base_backoff_s=10
            )
            now = (await s.execute(text("SELECT now()"))).scalar_one()
        r = (await rows(db, [event_id]))[event_id]
        assert r.last_error == f"start failed #{attempt}"
        assert r.locked_by is None and r.locked_at is None
        # Exponential backoff from the same transaction clock: 10 s, 20 s, 40 s.
        assert r.available_at - now == dt.timedelta(seconds=10 * 2 ** (attempt - 1))
        if attempt < MAX_ATTEMPTS:
            assert status == r.status == "pending"
            assert await claim(db, "relay-a", 10) == []  # not due yet
            await make_claimable(db, [event_id])
        else:
            assert status == r.status == "dead"

    await make_claimable(db, [event_id])
    assert await claim(db, "relay-a", 10) == []  # parked rows are never claimed
    async with db() as s:
        dead = await outbox_admin_db.list_dead(s)
    assert [(d.id, d.attempt_count, d.last_error) for d in dead] == [
        (event_id, MAX_ATTEMPTS, f"start failed #{MAX_ATTEMPTS}")
    ]

    async with db.begin() as s:
        assert [e.id for e in await outbox_admin_db.requeue(s, [event_id, 10**12])] == [event_id]
        # Pending is requeueable too (available now again): a repeated requeue is harmless.
        assert [e.status for e in await outbox_admin_db.requeue(s, [event_id])] == ["pending"]
    r = (await rows(db, [event_id]))[event_id]
    # The one rule: fresh attempts, and the error that needed an operator kept.
    assert (r.status, r.attempt_count, r.last_error) == (
        "pending",
        0,
        f"start failed #{MAX_ATTEMPTS}",
    )
    async with db() as s:
        assert await outbox_admin_db.list_dead(s) == []
    (again,) = await claim(db, "relay-c", 10)
    assert (again.id, again.attempt_count, again.locked_by) == (event_id, 1, "relay-c")


# ---- the crash window -----------------------------------------------------------------------


async def age_locks(sm: SessionMaker, ids: list[int], seconds: int) -> None:
    async with sm.begin() as s:
        await s.execute(
            text(
                "UPDATE outbox_event SET locked_at = now() - make_interval(secs => :s) "
                "WHERE id = ANY(:ids)"
            ),
            {"ids": ids, "s": seconds},
        )


async def test_rows_of_a_dead_claimer_come_back_after_the_ttl(db: SessionMaker) -> None:
    ids = await seed(db, 5)
    # relay-a commits its claim and dies before publishing anything.
    dead_claim = [r.id for r in await claim(db, "relay-a", 3)]
    assert dead_claim == ids[:3]
    assert [r.id for r in await claim(db, "relay-b", 10)] == ids[3:]  # others are unaffected

    async with db.begin() as s:
        assert await outbox_db.release_expired(s, ttl_s=30) == 0
    await age_locks(db, dead_claim, 20)
    async with db.begin() as s:
        assert await outbox_db.release_expired(s, ttl_s=30) == 0  # still within the TTL
    assert {r.status for r in (await rows(db, dead_claim)).values()} == {"processing"}

    await age_locks(db, dead_claim, 31)
    async with db.begin() as s:
        assert await outbox_db.release_expired(s, ttl_s=30) == 3
    released = await rows(db, dead_claim)
    assert all(r.status == "pending" and r.locked_by is None for r in released.values())
    # relay-b's fresh claim was not released.
    assert {r.status for r in (await rows(db, ids[3:])).values()} == {"processing"}

    retaken = await claim(db, "relay-c", 10)
    assert [r.id for r in retaken] == dead_claim
    assert all(r.attempt_count == 2 and r.locked_by == "relay-c" for r in retaken)
    async with db.begin() as s:
        # relay-a comes back to life: its late publish must not steal relay-c's rows.
        assert await outbox_db.mark_published(s, dead_claim, owner="relay-a") == 0
        assert await outbox_db.mark_published(s, dead_claim, owner="relay-c") == 3


# ---- insert ---------------------------------------------------------------------------------


async def insert(sm: SessionMaker, key: str, payload: dict[str, object]) -> int | None:
    async with sm.begin() as s:
        return await outbox_db.insert(
            s,
            event_type=ENQUEUE,
            aggregate_type="AiJob",
            aggregate_id="job-1",
            dedupe_key=key,
            payload=payload,
        )


async def test_duplicate_dedupe_key_is_a_no_op(db: SessionMaker) -> None:
    first = await insert(db, "synthetic:u1:k1", {"n": 1})
    assert first is not None
    assert await insert(db, "synthetic:u1:k1", {"n": 2}) is None
    (only,) = (await rows(db)).values()
    assert (only.id, only.payload, only.status) == (first, {"n": 1}, "pending")


async def test_concurrent_inserts_with_one_dedupe_key_write_one_row(db: SessionMaker) -> None:
    results = await asyncio.gather(*(insert(db, "synthetic:u1:race", {"n": i}) for i in range(20)))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert list((await rows(db)).keys()) == winners


async def test_published_and_pending_rows_are_not_released(db: SessionMaker) -> None:
    ids = await seed(db, 2)
    (row,) = await claim(db, "relay-a", 1)
    async with db.begin() as s:
        assert await outbox_db.mark_published(s, [row.id], owner="relay-a") == 1
    before = await rows(db)
    async with db.begin() as s:
        assert await outbox_db.release_expired(s, ttl_s=0) == 0
    assert await rows(db) == before
    assert [before[i].status for i in ids] == ["published", "pending"]


async def test_an_unreachable_target_never_exhausts_a_row(db: SessionMaker) -> None:
    """Temporal down for as long as it takes: the claim is given back each time."""
    (event_id,) = await seed(db, 1)
    for _ in range(MAX_ATTEMPTS * 3):
        (row,) = await claim(db, "relay-a", 10)
        assert row.attempt_count == 1
        async with db.begin() as s:
            status = await outbox_db.mark_failed(
                s, event_id, owner="relay-a", error="RPCError UNAVAILABLE", count_attempt=False
            )
        assert status == "pending"
        await make_claimable(db, [event_id])
    r = (await rows(db, [event_id]))[event_id]
    assert (r.status, r.attempt_count) == ("pending", 0)


async def test_backoff_is_capped(db: SessionMaker) -> None:
    (event_id,) = await seed(db, 1)
    async with db.begin() as s:
        await s.execute(
            text("UPDATE outbox_event SET attempt_count = 40 WHERE id = :id"), {"id": event_id}
        )
        await s.execute(
            text(
                "UPDATE outbox_event SET status = 'processing', locked_by = 'relay-a' "
                "WHERE id = :id"
            ),
            {"id": event_id},
        )
        await outbox_db.mark_failed(
            s, event_id, owner="relay-a", error="x", max_attempts=100, max_backoff_s=300
        )
        now = (await s.execute(text("SELECT now()"))).scalar_one()
    r = (await rows(db, [event_id]))[event_id]
    assert r.available_at - now == dt.timedelta(seconds=300)


async def test_mark_undispatchable_touches_only_the_claimers_row(db: SessionMaker) -> None:
    a, b = await seed(db, 2)
    await claim(db, "relay-a", 10)
    async with db.begin() as s:
        assert not await outbox_db.mark_undispatchable(s, a, owner="relay-b", error="malformed")
        assert await outbox_db.mark_undispatchable(s, a, owner="relay-a", error="malformed")
    got = await rows(db, [a, b])
    assert got[a].status == "failed" and got[b].status == "processing"
