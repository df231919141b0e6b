"""Capacity reserved per class on a shared key (AI_CAPACITY_RESERVE, db/limit_classes.py) on
the real PostgreSQL: while an interactive call waits, background calls leave its reserved part
free and the room that frees goes to it first, whatever the background users' turns; with no
interactive call waiting, background calls use the whole limit; without a reserve the queue is
the fair queue it was."""

from __future__ import annotations

import uuid

from db import limit_waiters as waiters_db
from db import provider_limits as provider_limits_db
from db.limit_waiters import WaiterId
from db.provider_limits import LimitKey, Limits, LimitTable
from db.session import SessionMaker
from jobs import limit_wake

KEY = LimitKey("p", "m", "platform")
RESERVED = LimitTable({"m": Limits(concurrency=4)}, {"interactive": 0.25}).for_model("p", "m")
PLAIN = Limits(concurrency=4)


def background(user: str) -> WaiterId:
    return WaiterId(uuid.uuid4(), None, user, "background")


def interactive(user: str) -> WaiterId:
    return WaiterId(uuid.uuid4(), None, user, "interactive")


async def admit(
    db: SessionMaker, who: WaiterId, limits: Limits
) -> provider_limits_db.LimitAdmission:
    async with db.begin() as s:
        return await provider_limits_db.admit(
            s,
            KEY,
            limits,
            tokens=100,
            job_id=who.job_id,
            lease_ttl_s=60,
            chunk_no=who.chunk_no,
            user_id=who.user_id,
            job_class=who.job_class,
        )


async def wait_in_queue(db: SessionMaker, who: WaiterId) -> None:
    async with db.begin() as s:
        await waiters_db.enqueue(
            s, KEY.params(), who, workflow_id=f"wf-{who.job_id}", tokens=100, ttl_s=60
        )


async def end(db: SessionMaker, lease_id: uuid.UUID | None) -> None:
    assert lease_id is not None
    async with db.begin() as s:
        await provider_limits_db.release(s, lease_id, KEY)


async def test_room_that_frees_goes_to_the_waiting_interactive_call_first(
    db: SessionMaker,
) -> None:
    # Four background calls fill the key; twenty more of twenty users wait for it.
    running = [(await admit(db, background(f"b{i}"), RESERVED)).lease_id for i in range(4)]
    assert all(running)
    queued = [background(f"w{i}") for i in range(20)]
    for who in queued:
        assert (await admit(db, who, RESERVED)).reason == "concurrency"
        await wait_in_queue(db, who)
    # A user at the keyboard arrives last: no slot is free, it waits, at the queue's front.
    flash = interactive("teacher")
    assert (await admit(db, flash, RESERVED)).reason == "concurrency"
    await wait_in_queue(db, flash)
    async with db() as s:
        heads = await waiters_db.heads(s, KEY.params(), reserved=["interactive"])
    assert heads[0].job_id == flash.job_id
    # One background call ends: the wake-up goes to the interactive call, no background one,
    # and a background waiter looking on its own does not get the slot either.
    await end(db, running.pop())
    assert await limit_wake.wake(db, KEY, RESERVED) == [f"wf-{flash.job_id}"]
    assert (await admit(db, queued[0], RESERVED)).reason == "concurrency"
    assert (await admit(db, flash, RESERVED)).lease_id is not None


async def test_other_classes_leave_the_reserved_part_free_while_it_waits(db: SessionMaker) -> None:
    running = [(await admit(db, background(f"b{i}"), RESERVED)).lease_id for i in range(4)]
    flash = interactive("teacher")
    await wait_in_queue(db, flash)
    # Two calls end: three background calls in flight at most while the interactive one
    # waits (concurrency 4, interactive 0.25: one slot kept).
    await end(db, running.pop())
    await end(db, running.pop())
    assert (await admit(db, background("late"), RESERVED)).lease_id is not None
    assert (await admit(db, background("later"), RESERVED)).reason == "concurrency"
    assert (await admit(db, flash, RESERVED)).lease_id is not None
    # Its part in use by its own call, the interactive class holds nothing back any more.
    more = interactive("student")
    await wait_in_queue(db, more)
    assert (await admit(db, background("later"), RESERVED)).reason == "concurrency"  # full


async def test_with_no_reserved_call_waiting_background_uses_the_whole_limit(
    db: SessionMaker,
) -> None:
    got = [await admit(db, background(f"b{i}"), RESERVED) for i in range(5)]
    assert [g.lease_id is not None for g in got] == [True, True, True, True, False]
    # No call in flight is taken back: an interactive call waits for the first that ends.
    flash = interactive("teacher")
    assert (await admit(db, flash, RESERVED)).reason == "concurrency"


async def test_without_a_reserve_the_queue_stays_fair_between_users(db: SessionMaker) -> None:
    running = [(await admit(db, background(f"b{i}"), PLAIN)).lease_id for i in range(4)]
    first = background("w0")
    await wait_in_queue(db, first)
    flash = interactive("teacher")
    await wait_in_queue(db, flash)
    await end(db, running.pop())
    # No reserve: the waiter that came first is served first, whatever its class.
    assert await limit_wake.wake(db, KEY, PLAIN) == [f"wf-{first.job_id}"]
    assert (await admit(db, flash, PLAIN)).reason == "concurrency"
