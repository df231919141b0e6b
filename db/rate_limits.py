"""A user's request rate across every API process: one token bucket per user, taken from by ONE
statement (`TAKE`), in one round trip.

The bucket holds at most `burst` requests and refills at `per_minute / 60` a second. Its level
is stored with the time it was computed (`refilled_at`); the statement refills it from that
time to the transaction's `now()`, takes one request's worth if there is a whole one, and
writes the new level back, all in the INSERT ... ON CONFLICT DO UPDATE that also creates a
user's row (a missing row is a full bucket). Concurrent takes of one user serialise on the
row's lock, and each refills from the level the previous one committed, so N processes share
one limit and no take is lost or counted twice. A request refused still writes the refilled
level (the same bucket, read later): nothing accumulates while a client is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlalchemy import text

from db import pipeline
from db.session import SessionMaker

# The level refilled to `now()`, capped at the burst; the take's clock never runs backwards
# (a transaction that started before the last writer's keeps that writer's time).
_REFILLED = (
    "least(CAST(:burst AS float8), b.tokens + CAST(:rate AS float8) * greatest(0.0, "
    "CAST(extract(epoch FROM now() - b.refilled_at) AS float8)))"
)

TAKE = text(
    f"""
    INSERT INTO api_rate_bucket AS b (user_id, tokens, refilled_at, granted)
    VALUES (:user_id, CAST(:burst AS float8) - 1.0, now(), true)
    ON CONFLICT (user_id) DO UPDATE SET
        tokens = {_REFILLED} - CASE WHEN {_REFILLED} >= 1.0 THEN 1.0 ELSE 0.0 END,
        refilled_at = greatest(b.refilled_at, now()),
        granted = {_REFILLED} >= 1.0
    RETURNING granted, tokens
    """
)


@dataclass(frozen=True)
class Take:
    """One take: granted, or refused with the whole seconds until one request's worth has
    refilled (at least 1)."""

    granted: bool
    retry_after_s: int


def retry_after(tokens: float, per_minute: int) -> int:
    """Whole seconds until a bucket at `tokens` holds one request's worth; at least 1."""
    rate = per_minute / 60.0
    return max(1, math.ceil((1.0 - tokens) / rate)) if rate > 0 else 60


async def take(sm: SessionMaker, user_id: str, *, per_minute: int, burst: int) -> Take:
    """Takes one request from `user_id`'s bucket (`TAKE`): BEGIN, the statement and COMMIT in
    one round trip."""
    params = {"user_id": user_id, "burst": burst, "rate": per_minute / 60.0}
    [rows] = await pipeline.run(sm, [(TAKE, params)], commit=True)
    row = rows[0]
    granted = bool(row["granted"])
    return Take(granted, 0 if granted else retry_after(float(row["tokens"]), per_minute))
