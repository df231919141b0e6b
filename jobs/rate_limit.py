"""A user's request rate limit, one across every API process (db/rate_limits.py).

`take_request` is what a route that starts costly work per request calls first, after it knows
the user: creates, quotes, a user's own retries, a schedule's create, resume and trigger share
the bucket, and so does each run of a schedule (jobs/schedules.py). Past the rate it raises
`RateLimited` (429 `RATE_LIMITED` with Retry-After in whole seconds, at least 1): refused
requests cost one statement and nothing else. Reads never call it.
"""

from __future__ import annotations

from db import rate_limits as rate_limits_db
from db.session import SessionMaker
from engine.errors import RateLimited


async def take_request(sm: SessionMaker, user_id: str, *, per_minute: int, burst: int) -> None:
    """One request of `user_id` against its rate (`per_minute` on average, `burst` at once;
    `per_minute` 0: unlimited, nothing is read), or RateLimited."""
    if per_minute <= 0:
        return
    took = await rate_limits_db.take(sm, user_id, per_minute=per_minute, burst=burst)
    if not took.granted:
        raise RateLimited(
            f"At most {per_minute} creates, quotes, retries and schedule runs per minute per user "
            f"(bursts of {burst}); "
            "try again later.",
            retry_after_s=took.retry_after_s,
        )
