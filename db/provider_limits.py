"""Provider limits per (provider, model, key), shared by every worker through PostgreSQL: a
request bucket and a token bucket per minute (`provider_limit`, one row per key) and the calls
in flight under a concurrency limit (`provider_call_lease`), so the engine slows down before
the provider answers 429.

Buckets: each holds at most its per-minute limit and refills continuously at limit/60 per
second since `refilled_at`; a call takes one request and its tokens (estimated input plus its
answer budget, as OpenAI counts a request against TPM). A call larger than the whole token
bucket goes when the bucket is full (it is never starved) and leaves it in debt. A dimension
without a limit stores +Infinity, so a limit that appears later starts with a full bucket.
The limit in force is the lower of the configured one (AI_MODEL_LIMITS) and the one the
provider announced in its `x-ratelimit-limit-*` headers; `blocked_until` is set when the
provider said nothing is left (`x-ratelimit-remaining-*: 0`) until its reset.

Races: a key's row is created once (INSERT ... ON CONFLICT DO NOTHING), then read with
`SELECT ... FOR UPDATE`, which serialises the admissions of one key until their transactions
end, and reads the latest committed buckets and leases (READ COMMITTED takes a new snapshot per
statement, after the lock). Leases are inserted only under that row lock, so counting them
there never over-admits; a lease expires on its own (`expires_at`) so a dead worker never
holds a slot for ever.

Order: a call is admitted only with room for it after room for every waiter ahead of it in
the key's fair queue (db/limit_waiters.py: fair between users, first come first served within
one), so nobody passes a waiter, and the wait this answers is the exact time room appears for
the caller behind those ahead. The configured limits (AI_MODEL_LIMITS) are parsed in
db/limit_config.py.

Cost when unused: with no configured limit the repository reads the key's row once (a
provider may have announced limits for it) and writes nothing; a key the synthetic provider
serves without a configured limit is never asked at all (the caller skips it).

Every method runs in the caller's transaction and never commits: a wait rolls the caller's
transaction back, so nothing is taken while a job waits.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncSession

from db import limit_classes, limit_waiters
from db.limit_config import Limits, LimitTable, parse_model_limits
from db.limit_waiters import Room, WaiterId, WaitReason
from db.pipeline import Statement
from engine.limit_wait import LIMIT_WAIT_BACKSTOP_S

PLATFORM_KEY_REF = "platform"
# The shortest wait a concurrency limit answers. Leases end when calls end, which no timer
# predicts: the wait is until the first lease expires (a killed worker's sends no NOTIFY), at
# most the backstop; a workflow of this version ends it earlier on a wake-up signal. With no
# lease in flight the free slots are held for the waiters ahead (woken, or looking again in
# their own EXECUTE): their calls' ends wake the caller, so it waits for the backstop too
# rather than polling every second.
CONCURRENCY_POLL_S = 1.0


@dataclass(frozen=True)
class LimitKey:
    """Whose bucket a call takes from: the provider's name, the model and the key's reference
    (`platform` or `key:<credential id>`, as the provider gate names it; never the key)."""

    provider: str
    model: str
    key_ref: str = PLATFORM_KEY_REF

    def params(self) -> dict[str, str]:
        return {"p": self.provider[:64], "m": self.model[:128], "k": self.key_ref[:80]}


@dataclass(frozen=True)
class LimitAdmission:
    """`wait_s` 0: call now (holding `lease_id` when a concurrency limit applies, which the
    caller settles); otherwise ask again after that long, for `reason`. `metered`: the key's
    buckets took this call (the caller settles it to give unused tokens back)."""

    wait_s: float = 0.0
    reason: WaitReason | None = None
    lease_id: uuid.UUID | None = None
    metered: bool = False


class RateLimitInfo(Protocol):
    """What a provider's answer announced: `providers.base.RateLimitHeaders` (`db/` does not
    import `providers/`, so the shape is named here)."""

    @property
    def limit_requests(self) -> int | None: ...
    @property
    def limit_tokens(self) -> int | None: ...
    @property
    def remaining_requests(self) -> int | None: ...
    @property
    def remaining_tokens(self) -> int | None: ...
    @property
    def reset_requests_s(self) -> float | None: ...
    @property
    def reset_tokens_s(self) -> float | None: ...


def _lower(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def _bucket(stored: float, rate: int | None, elapsed_s: float) -> float:
    """A bucket's content now: what was stored plus the refill since, at most its size."""
    if rate is None:
        return math.inf
    return min(float(rate), stored + elapsed_s * rate / 60.0)


_READ = """
    SELECT requests_available, tokens_available, announced_rpm, announced_tpm,
           greatest(extract(epoch FROM clock_timestamp() - refilled_at), 0) AS elapsed,
           extract(epoch FROM blocked_until - clock_timestamp()) AS blocked_s,
           clock_timestamp() AS read_at
    FROM provider_limit WHERE provider = :p AND model = :m AND key_ref = :k
"""
_READ_ONLY = text(_READ)
_READ_FOR_UPDATE = text(_READ + " FOR UPDATE")
_CREATE = text(
    """
    INSERT INTO provider_limit (provider, model, key_ref,
        requests_available, tokens_available, refilled_at)
    VALUES (:p, :m, :k, 'Infinity', 'Infinity', clock_timestamp())
    ON CONFLICT (provider, model, key_ref) DO NOTHING
    """
)
# Expired leases (their workers died) are dropped on the way; a new statement, so it sees
# every lease committed before this caller got the row lock.
_IN_FLIGHT = text(
    """
    WITH gone AS (
        DELETE FROM provider_call_lease
        WHERE provider = :p AND model = :m AND key_ref = :k
          AND expires_at <= clock_timestamp()
    )
    SELECT count(*) AS n,
           extract(epoch FROM min(expires_at) - clock_timestamp()) AS first_expiry_s
    FROM provider_call_lease
    WHERE provider = :p AND model = :m AND key_ref = :k
      AND expires_at > clock_timestamp()
    """
)
# The same per class of the calls in flight (a key with a reserve: db/limit_classes.py).
_IN_FLIGHT_BY_CLASS = text(
    """
    WITH gone AS (
        DELETE FROM provider_call_lease
        WHERE provider = :p AND model = :m AND key_ref = :k
          AND expires_at <= clock_timestamp()
    )
    SELECT job_class, count(*) AS n,
           extract(epoch FROM min(expires_at) - clock_timestamp()) AS first_expiry_s
    FROM provider_call_lease
    WHERE provider = :p AND model = :m AND key_ref = :k
      AND expires_at > clock_timestamp()
    GROUP BY job_class
    """
)
_LEASE = text(
    """
    INSERT INTO provider_call_lease
        (id, provider, model, key_ref, job_id, tokens, expires_at, job_class)
    VALUES (:id, :p, :m, :k, :job, :tokens,
            clock_timestamp() + make_interval(secs => :ttl), :klass)
    """
)
_TAKE = text(
    """
    UPDATE provider_limit SET requests_available = :r, tokens_available = :t,
           refilled_at = :at
    WHERE provider = :p AND model = :m AND key_ref = :k
    """
)
_END_LEASE = text("DELETE FROM provider_call_lease WHERE id = :id")
_GIVE_BACK = text(
    """
    UPDATE provider_limit SET tokens_available = least(
        tokens_available + :back, :cfg_tpm, announced_tpm)
    WHERE provider = :p AND model = :m AND key_ref = :k
      AND tokens_available < 'Infinity'
    """
)
# Both buckets are brought up to now (refilled at the limit in force after these headers)
# before the provider's remaining caps them, so `refilled_at` stays exact.
_ANNOUNCED = text(
    """
    INSERT INTO provider_limit AS l (provider, model, key_ref, requests_available,
        tokens_available, refilled_at, announced_rpm, announced_tpm, blocked_until)
    VALUES (:p, :m, :k,
            coalesce(CAST(:rem_r AS float8), 'Infinity'),
            coalesce(CAST(:rem_t AS float8), 'Infinity'),
            clock_timestamp(), :lim_r, :lim_t,
            clock_timestamp() + make_interval(secs => CAST(:block AS float8)))
    ON CONFLICT (provider, model, key_ref) DO UPDATE SET
        requests_available = least(
            l.requests_available + greatest(
                extract(epoch FROM clock_timestamp() - l.refilled_at), 0)
                * coalesce(least(CAST(:cfg_rpm AS integer),
                                 coalesce(CAST(:lim_r AS integer), l.announced_rpm)),
                           0) / 60.0,
            least(CAST(:cfg_rpm AS integer),
                  coalesce(CAST(:lim_r AS integer), l.announced_rpm)),
            CAST(:rem_r AS float8)),
        tokens_available = least(
            l.tokens_available + :back + greatest(
                extract(epoch FROM clock_timestamp() - l.refilled_at), 0)
                * coalesce(least(CAST(:cfg_tpm AS integer),
                                 coalesce(CAST(:lim_t AS integer), l.announced_tpm)),
                           0) / 60.0,
            least(CAST(:cfg_tpm AS integer),
                  coalesce(CAST(:lim_t AS integer), l.announced_tpm)),
            CAST(:rem_t AS float8)),
        refilled_at = clock_timestamp(),
        announced_rpm = coalesce(EXCLUDED.announced_rpm, l.announced_rpm),
        announced_tpm = coalesce(EXCLUDED.announced_tpm, l.announced_tpm),
        blocked_until = CASE
            WHEN EXCLUDED.blocked_until IS NULL THEN l.blocked_until
            ELSE greatest(l.blocked_until, EXCLUDED.blocked_until) END
    """
)


async def _locked_row(s: AsyncSession, params: dict[str, str], limits: Limits) -> Row[Any] | None:
    """The key's row, locked until the caller's transaction ends; None: no configured limit
    and nothing announced holds the key (read once, no lock, no row written)."""
    if not limits.configured:
        row = (await s.execute(_READ_ONLY, params)).first()
        if row is None or (
            row.announced_rpm is None
            and row.announced_tpm is None
            and not (row.blocked_s and float(row.blocked_s) > 0)
        ):
            return None
        return (await s.execute(_READ_FOR_UPDATE, params)).first()
    row = (await s.execute(_READ_FOR_UPDATE, params)).first()
    if row is None:
        await s.execute(_CREATE, params)
        row = (await s.execute(_READ_FOR_UPDATE, params)).first()
    assert row is not None  # created above, and rows are never deleted
    return row


async def room(s: AsyncSession, key: LimitKey, limits: Limits) -> Room | None:
    """The key's limits and what they hold now, its row locked until the caller's transaction
    ends (expired leases swept on the way). None: nothing limits the key."""
    params = key.params()
    row = await _locked_row(s, params, limits)
    if row is None:
        return None
    rpm = _lower(limits.rpm, row.announced_rpm)
    tpm = _lower(limits.tpm, row.announced_tpm)
    elapsed = float(row.elapsed)
    free: int | None = None
    slot_in_s = 0.0
    in_flight: dict[str, int] = {}
    blocked = float(row.blocked_s) if row.blocked_s is not None else 0.0
    if limits.concurrency is not None and blocked <= 0 and limits.reserve:
        by_class = (await s.execute(_IN_FLIGHT_BY_CLASS, params)).all()
        in_flight = {r.job_class or "": int(r.n) for r in by_class}
        free = limits.concurrency - sum(in_flight.values())
        expiries = [float(r.first_expiry_s) for r in by_class if r.first_expiry_s is not None]
        slot_in_s = max(min(expiries), 0.0) if expiries else 0.0
    elif limits.concurrency is not None and blocked <= 0:
        leases = (await s.execute(_IN_FLIGHT, params)).one()
        free = limits.concurrency - int(leases.n)
        if leases.first_expiry_s is not None:
            slot_in_s = max(float(leases.first_expiry_s), 0.0)
    return Room(
        rpm=rpm,
        tpm=tpm,
        requests=_bucket(float(row.requests_available), rpm, elapsed),
        tokens=_bucket(float(row.tokens_available), tpm, elapsed),
        free_slots=free,
        slot_in_s=slot_in_s,
        blocked_s=max(blocked, 0.0),
        rpm_reason="rpm" if rpm == limits.rpm else "announced",
        tpm_reason="tpm" if tpm == limits.tpm else "announced",
        read_at=row.read_at,
        in_flight=in_flight,
    )


async def admit(
    s: AsyncSession,
    key: LimitKey,
    limits: Limits,
    *,
    tokens: int,
    job_id: uuid.UUID,
    lease_ttl_s: float,
    chunk_no: int | None = None,
    user_id: str = "",
    job_class: str | None = None,
) -> LimitAdmission:
    """Whether a call of `tokens` may go now with `key`, after the waiters ahead of it in the
    key's fair queue (db/limit_waiters.py: room is reserved for each of them first, and for
    the reserved part of other classes' waiting calls, db/limit_classes.py); when it may, its
    request and tokens are taken from the buckets (and a lease is held under a concurrency
    limit) and it leaves the queue. The row lock this takes is held until the caller's
    transaction ends."""
    params = key.params()
    now = await room(s, key, limits)
    if now is None:
        return LimitAdmission()
    who = WaiterId(job_id, chunk_no, user_id, job_class)
    got, queued = await limit_classes.look(s, params, who, now, tokens, limits.reserve)
    if got.reason == "concurrency":
        # At the latest when the first lease expires (its worker was killed: no NOTIFY); with
        # none in flight (0), the backstop: the waiters ahead hold the free slots.
        first_expiry_s = got.wait_s if got.wait_s > 0 else LIMIT_WAIT_BACKSTOP_S
        wait_s = min(max(first_expiry_s, CONCURRENCY_POLL_S), LIMIT_WAIT_BACKSTOP_S)
        return LimitAdmission(wait_s, "concurrency")
    if got.reason is not None:
        return LimitAdmission(got.wait_s, got.reason)
    lease_id = None
    if limits.concurrency is not None:
        lease_id = uuid.uuid4()
        lease = {**params, "id": lease_id, "job": job_id, "tokens": tokens}
        await s.execute(_LEASE, {**lease, "ttl": lease_ttl_s, "klass": job_class})
    if now.rpm is not None or now.tpm is not None:
        taken = {
            **params,
            "r": now.requests - 1 if now.rpm is not None else math.inf,
            "t": now.tokens - tokens if now.tpm is not None else math.inf,
            "at": now.read_at,
        }
        await s.execute(_TAKE, taken)
    if queued:
        await limit_waiters.leave(s, who)
    return LimitAdmission(lease_id=lease_id, metered=now.tpm is not None)


@dataclass(frozen=True)
class LimitSettle:
    """The end of a call `admit` admitted: its lease (if any), the tokens it reserved and
    used, the answer's rate-limit headers, the configured limits and the longest block."""

    key: LimitKey
    lease_id: uuid.UUID | None
    tokens_reserved: int
    tokens_used: int
    headers: RateLimitInfo | None
    limits: Limits | None = None
    max_block_s: float = 300.0


def _block_s(headers: RateLimitInfo, max_block_s: float) -> float | None:
    """How long the key is blocked: until the reset of a dimension the provider said has
    nothing left (at most `max_block_s`); None: nothing is used up."""
    return max(
        (
            min(reset or 0.0, max_block_s)
            for remaining, reset in (
                (headers.remaining_requests, headers.reset_requests_s),
                (headers.remaining_tokens, headers.reset_tokens_s),
            )
            if remaining == 0
        ),
        default=None,
    )


def settle_statements(st: LimitSettle) -> list[Statement]:
    """`settle`'s statements, in order, for the caller to send in its transaction (EXECUTE's
    last transaction pipelines them after the attempt's UPDATE, db/attempts.py)."""
    params = st.key.params()
    out: list[Statement] = []
    back = max(st.tokens_reserved - st.tokens_used, 0)
    if st.lease_id is not None or back > 0:
        # Room may have appeared: the key's waker signals the fair heads that now fit.
        out.append(limit_waiters.notify_statement(params))
    if st.lease_id is not None:
        out.append((_END_LEASE, {"id": st.lease_id}))
    cfg = st.limits or Limits()
    h = st.headers
    if h is None:
        if back > 0:
            out.append((_GIVE_BACK, {**params, "back": back, "cfg_tpm": cfg.tpm}))
        return out
    announced = {
        **params,
        "rem_r": h.remaining_requests,
        "rem_t": h.remaining_tokens,
        "lim_r": h.limit_requests,
        "lim_t": h.limit_tokens,
        "cfg_rpm": cfg.rpm,
        "cfg_tpm": cfg.tpm,
        "back": back,
        "block": _block_s(h, st.max_block_s),
    }
    out.append((_ANNOUNCED, announced))
    return out


async def settle(
    s: AsyncSession,
    key: LimitKey,
    lease_id: uuid.UUID | None,
    *,
    tokens_reserved: int,
    tokens_used: int,
    headers: RateLimitInfo | None,
    limits: Limits | None = None,
    max_block_s: float = 300.0,
) -> None:
    """A call admitted by `admit` ended: its lease ends; the tokens it reserved and did not
    use go back (never past the bucket's size: `limits` are the configured ones); what the
    answer's headers say tightens the buckets (the lower of ours and the provider's
    remaining), records the announced limits, and blocks the key until a reset when the
    provider said nothing is left (at most `max_block_s`). Headers create the key's row
    even without configured limits: the engine learns the provider's limits that way."""
    st = LimitSettle(key, lease_id, tokens_reserved, tokens_used, headers, limits, max_block_s)
    for stmt, params in settle_statements(st):
        await s.execute(stmt, params)


async def release(s: AsyncSession, lease_id: uuid.UUID, key: LimitKey | None = None) -> None:
    """A lease whose call was never settled (the bookkeeping itself failed): the slot is
    free at once rather than when the lease expires (and the key's waker is told, if given)."""
    await s.execute(_END_LEASE, {"id": lease_id})
    if key is not None:
        stmt, params = limit_waiters.notify_statement(key.params())
        await s.execute(stmt, params)


__all__ = [
    "LimitAdmission",
    "LimitKey",
    "LimitSettle",
    "LimitTable",
    "Limits",
    "admit",
    "parse_model_limits",
    "release",
    "room",
    "settle",
    "settle_statements",
]
