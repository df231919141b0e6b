"""Capacity reserved per class of calls on a shared provider key (AI_CAPACITY_RESERVE).

A call's class is its job type's queue: `interactive` or `background` (engine/capacity.py). A
class with a share `r` keeps, of every limited key, `ceil(r x concurrency)` calls at once,
`ceil(r x rpm)` requests and `ceil(r x tpm)` tokens: its reserved part. While a call of that
class waits for the key:

- its waiters are served first: they stand ahead of every waiter of a class without a reserve
  in the key's queue, whatever their users' turns (db/limit_waiters.py, the class-aware order;
  among classes that both have a reserve, the fair order decides);
- a call of another class is admitted only if it leaves that class's reserved part free: the
  reserved calls at once not in use by the class's own calls in flight, the reserved requests
  and tokens in the buckets, each beyond the waiters of that class already ahead of it
  (`held_back`).

While no call of a reserved class waits, the others may use the whole limit; what they borrowed
comes back as their calls end (no call in flight is cancelled for it). With no reserve
configured none of this runs: the queue and its admission are db/limit_waiters.py's alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from db import limit_waiters
from db.limit_waiters import ClassAhead, Head, HeldBack, Room, Verdict, WaiterId, verdict


@dataclass(frozen=True)
class Part:
    """A class's reserved part of one key: calls at once, requests and tokens."""

    slots: int = 0
    requests: int = 0
    tokens: int = 0


def parts(room: Room, reserve: Sequence[tuple[str, float]]) -> dict[str, Part]:
    """Each reserved class's part of the key's limits in force (rounded up to whole calls,
    requests and tokens; 0 for a dimension without a limit)."""
    slots = (room.free_slots or 0) + sum(room.in_flight.values())
    return {
        c: Part(
            math.ceil(share * slots) if room.free_slots is not None else 0,
            math.ceil(share * room.rpm) if room.rpm is not None else 0,
            math.ceil(share * room.tpm) if room.tpm is not None else 0,
        )
        for c, share in reserve
    }


def held_back(
    room: Room,
    reserve: Sequence[tuple[str, float]],
    caller_class: str | None,
    classes: Sequence[ClassAhead],
) -> HeldBack:
    """What a caller of `caller_class` must leave for the other reserved classes that have a
    call waiting: each one's reserved part (its slots less its own calls in flight) beyond
    what that class's waiters ahead of the caller already count."""
    if not reserve:
        return HeldBack()
    reserved = parts(room, reserve)
    slots = requests = 0
    tokens = 0.0
    for c in classes:
        part = reserved.get(c.job_class or "")
        if part is None or c.job_class == caller_class or c.waiting <= 0:
            continue
        free_part = max(part.slots - room.in_flight.get(c.job_class or "", 0), 0)
        slots += max(free_part - c.ahead, 0)
        requests += max(part.requests - c.ahead, 0)
        tokens += max(part.tokens - c.ahead_tokens, 0.0)
    return HeldBack(slots, requests, tokens)


async def look(
    s: AsyncSession,
    key_params: dict[str, str],
    who: WaiterId,
    room: Room,
    tokens: int,
    reserve: Sequence[tuple[str, float]],
) -> tuple[Verdict, bool]:
    """Whether `who`'s call of `tokens` may go now (room for it after the waiters ahead of it
    and what is held back for other classes), and whether it has a row in the queue. Without
    a reserve: the fair queue's own rule, one statement as before."""
    if not reserve:
        n, ahead_tokens, queued = await limit_waiters.ahead(s, key_params, who, cap_tokens=room.tpm)
        return verdict(room, n, ahead_tokens, tokens), queued
    classes, queued = await limit_waiters.ahead_by_class(
        s, key_params, who, cap_tokens=room.tpm, reserved=[c for c, _ in reserve]
    )
    n = sum(c.ahead for c in classes)
    ahead_tokens = sum(c.ahead_tokens for c in classes)
    held = held_back(room, reserve, who.job_class, classes)
    return verdict(room, n, ahead_tokens, tokens, held), queued


def fitting(room: Room, queue: Sequence[Head], reserve: Sequence[tuple[str, float]]) -> list[Head]:
    """db/limit_waiters.py `fitting` over the class-aware order: each head also leaves what the
    other reserved classes waiting in `queue` are kept."""
    if not reserve:
        return limit_waiters.fitting(room, queue)

    def held(i: int, heads: Sequence[Head]) -> HeldBack:
        return held_back(room, reserve, heads[i].job_class, _per_class(room, heads, i))

    return limit_waiters.fitting(room, queue, held)


def _per_class(room: Room, heads: Sequence[Head], i: int) -> list[ClassAhead]:
    """The waiters of each class in `heads` as head `i` sees them (itself left out)."""
    counts: dict[str | None, list[float]] = {}
    for j, h in enumerate(heads):
        if j == i:
            continue
        got = counts.setdefault(h.job_class, [0, 0.0, 0])
        got[2] += 1
        if j < i:
            got[0] += 1
            got[1] += room.need(h.tokens)
    return [ClassAhead(c, int(v[0]), v[1], int(v[2])) for c, v in counts.items()]
