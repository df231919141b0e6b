"""The fair queue of a provider limit's waiters (db/limit_waiters.py) on real PostgreSQL: fair
between users and first come first served within one, admission only after room for the
waiters ahead, stale waiters never blocking, and wake-up claims that two wakers never share."""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import text

from db import limit_waiters as waiters_db
from db import provider_limits as provider_limits_db
from db.limit_waiters import WaiterId
from db.provider_limits import LimitKey, Limits
from db.session import SessionMaker
from engine.limit_wait import LIMIT_WAIT_BACKSTOP_S
from jobs import limit_wake

KEY = LimitKey("p", "m", "platform")


async def enter(db: SessionMaker, user: str, tokens: int = 100, ttl_s: float = 60.0) -> WaiterId:
    who = WaiterId(uuid.uuid4(), None, user)
    async with db.begin() as s:
        assert await waiters_db.enqueue(
            s, KEY.params(), who, workflow_id=f"wf-{who.job_id}", tokens=tokens, ttl_s=ttl_s
        )
    return who


async def admit(
    db: SessionMaker, who: WaiterId, limits: Limits, tokens: int = 100
) -> provider_limits_db.LimitAdmission:
    async with db.begin() as s:
        return await provider_limits_db.admit(
            s,
            KEY,
            limits,
            tokens=tokens,
            job_id=who.job_id,
            lease_ttl_s=60,
            chunk_no=who.chunk_no,
            user_id=who.user_id,
        )


async def order(db: SessionMaker) -> list[uuid.UUID]:
    async with db() as s:
        return [h.job_id for h in await waiters_db.heads(s, KEY.params())]


async def test_the_queue_is_fair_between_users_and_fifo_within_one(db: SessionMaker) -> None:
    a1, a2, a3 = [await enter(db, "a") for _ in range(3)]
    b1, b2 = [await enter(db, "b") for _ in range(2)]
    c1 = await enter(db, "c")
    assert await order(db) == [w.job_id for w in (a1, b1, c1, a2, b2, a3)]
    # A look keeps its place: a1 enters again (a later look) and is still first.
    async with db.begin() as s:
        entered = await waiters_db.enqueue(
            s, KEY.params(), a1, workflow_id="wf", tokens=100, ttl_s=60
        )
    assert not entered
    assert (await order(db))[0] == a1.job_id


async def test_a_slot_is_kept_for_each_waiter_ahead(db: SessionMaker) -> None:
    limits = Limits(concurrency=1)
    a1 = await enter(db, "a")
    # One free slot, but a1 waits ahead of a newcomer of another user: the newcomer waits.
    newcomer = WaiterId(uuid.uuid4(), None, "b")
    assert (await admit(db, newcomer, limits)).reason == "concurrency"
    got = await admit(db, a1, limits)
    assert got.lease_id is not None  # the head goes, and leaves the queue
    assert await order(db) == []
    assert (await admit(db, newcomer, limits)).reason == "concurrency"  # the slot is taken
    async with db.begin() as s:
        await provider_limits_db.release(s, got.lease_id, KEY)
    assert (await admit(db, newcomer, limits)).lease_id is not None


async def test_a_caller_behind_a_slot_held_for_a_waiter_ahead_does_not_poll(
    db: SessionMaker,
) -> None:
    # No call in flight; the one free slot is held for a1, whose call's end will wake the
    # caller behind it: the caller waits for its wake-up (the backstop at most), not a poll.
    a1 = await enter(db, "a")
    newcomer = WaiterId(uuid.uuid4(), None, "b")
    got = await admit(db, newcomer, Limits(concurrency=1))
    assert got.reason == "concurrency" and got.wait_s == LIMIT_WAIT_BACKSTOP_S
    lease = await admit(db, a1, Limits(concurrency=1))
    assert lease.lease_id is not None
    # A call in flight: until its lease expires (60 s here), at most the backstop.
    got = await admit(db, newcomer, Limits(concurrency=1))
    assert got.reason == "concurrency" and 55.0 < got.wait_s <= LIMIT_WAIT_BACKSTOP_S


async def test_a_large_call_is_not_passed_by_small_ones_behind_it(db: SessionMaker) -> None:
    limits = Limits(tpm=6000)  # 100 tokens a second
    async with db.begin() as s:
        await s.execute(
            text(
                "INSERT INTO provider_limit (provider, model, key_ref, requests_available, "
                "tokens_available, refilled_at) VALUES (:p, :m, :k, 'Infinity', 1000, "
                "clock_timestamp())"
            ),
            KEY.params(),
        )
    big = await enter(db, "big", tokens=5000)
    small = WaiterId(uuid.uuid4(), None, "small")
    # 1000 tokens are there, the small call needs 10, but room for the big one comes first:
    # the small one waits until the bucket holds both (5010 - ~1000) / 100 s.
    got = await admit(db, small, limits, tokens=10)
    assert got.reason == "tpm" and 39.0 < got.wait_s <= 40.2
    got = await admit(db, big, limits, tokens=5000)
    assert got.reason == "tpm" and 39.0 < got.wait_s <= 40.1  # its own exact refill


async def test_stale_waiters_never_block(db: SessionMaker) -> None:
    limits = Limits(concurrency=1)
    await enter(db, "gone", ttl_s=0.01)  # its workflow stopped looking
    await asyncio.sleep(0.05)
    assert (await admit(db, WaiterId(uuid.uuid4(), None, "x"), limits)).lease_id is not None
    async with db() as s:
        assert await waiters_db.sweep(s) == 1


async def test_two_wakers_never_claim_the_same_waiter(db: SessionMaker) -> None:
    limits = Limits(concurrency=2)
    waiters = [await enter(db, f"u{i}") for i in range(5)]
    claims = await asyncio.gather(*(limit_wake.wake(db, KEY, limits) for _ in range(4)))
    claimed = [wf for c in claims for wf in c]
    # Two free slots: the two fair heads, each claimed once.
    assert sorted(claimed) == sorted(f"wf-{w.job_id}" for w in waiters[:2])
    # A claim is not repeated while it is fresh.
    assert await limit_wake.wake(db, KEY, limits) == []
