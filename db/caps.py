"""Per-user caps that hold across processes: each slot a lease row (`cap_lease`), taken under a
per-(kind, user) advisory lock, renewed while held, and expiring on its own.

`take` is one round trip: BEGIN, the transaction-scoped advisory lock of (kind, user), then ONE
statement that deletes the user's expired leases and inserts the new one only if fewer than
`cap` live leases remain, then COMMIT. The lock serialises one user's takes across processes
(each statement reads after the previous taker committed), so the count cannot be overshot; a
process that dies stops renewing and its leases lapse after their TTL, so a crash never keeps a
user's slots. `renew` extends a process's own leases in one statement, `release` deletes one.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import text

from db import pipeline
from db.session import SessionMaker

LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended('cap:' || :kind || ':' || :user_id, 0))")
TAKE = text(
    """
    WITH expired AS (
        DELETE FROM cap_lease
        WHERE kind = :kind AND user_id = :user_id AND expires_at <= now())
    INSERT INTO cap_lease (id, kind, user_id, holder, expires_at)
    SELECT :id, :kind, :user_id, :holder, now() + make_interval(secs => :ttl)
    WHERE (SELECT count(*) FROM cap_lease
           WHERE kind = :kind AND user_id = :user_id AND expires_at > now()) < :cap
    RETURNING id
    """
)
RENEW = text(
    "UPDATE cap_lease SET expires_at = now() + make_interval(secs => :ttl) "
    "WHERE id = ANY(CAST(:ids AS uuid[])) AND expires_at > now() RETURNING id"
)
RELEASE = text("DELETE FROM cap_lease WHERE id = :id")


async def take(
    sm: SessionMaker, kind: str, user_id: str, *, cap: int, holder: str, ttl_s: float
) -> uuid.UUID | None:
    """A new lease of `user_id`'s `kind` cap for `holder`, or None when `cap` live leases are
    held already (by any process)."""
    lease_id = uuid.uuid4()
    who = {"kind": kind, "user_id": user_id}
    params = {**who, "id": lease_id, "holder": holder[:200], "ttl": ttl_s, "cap": cap}
    _, rows = await pipeline.run(sm, [(LOCK, who), (TAKE, params)], commit=True)
    return lease_id if rows else None


async def renew(
    sm: SessionMaker, lease_ids: Sequence[uuid.UUID], *, ttl_s: float
) -> set[uuid.UUID]:
    """Extends the live leases among `lease_ids` by `ttl_s` from now; returns those renewed
    (a lease that had lapsed is not revived: its slot may have been taken since)."""
    if not lease_ids:
        return set()
    [rows] = await pipeline.run(sm, [(RENEW, {"ids": list(lease_ids), "ttl": ttl_s})], commit=True)
    return {r["id"] for r in rows}


async def release(sm: SessionMaker, lease_id: uuid.UUID) -> None:
    await pipeline.run(sm, [(RELEASE, {"id": lease_id})], commit=True)
