"""The fair queue of calls waiting for a provider limit, per (provider, model, key_ref), in
PostgreSQL (`limit_waiter`), and the rule that admits a call only after the waiters ahead of it.

Order: fair between users, first come first served within a user (start-time fair queuing).
A waiter gets a `turn` when it enters: one after its user's last live waiter's turn, or, when its
user has none, the lowest live turn (the one being served now: it neither jumps ahead of it nor
goes behind everyone). The queue is ordered by (`turn`, `seq`, the order of entry): every user's
first waiter, then every user's second... A user with a backlog is served one call per turn
beside a user who just arrived. A turn is kept for good (ranks recomputed at each look would
put the oldest user's backlog first, which is first come first served, not fair). A caller
not yet in the queue stands where it would enter: its new turn, after every waiter of that turn.
A waiter keeps its place on every later look until it is admitted.

Admission (`verdict`): a call goes only if there is room for it after reserving room for every
waiter ahead of it: under a concurrency limit, more free slots than waiters ahead; under rpm,
at least (waiters ahead + 1) requests; under tpm, at least the tokens of the waiters ahead plus
its own (each need capped at the bucket's size, so a call larger than the bucket still goes when
the bucket is full). Nobody behind a waiter can take the room it waits for, so a large call is
never starved by small ones arriving after it, and the exact time room appears for a caller (the
refill of the deficit) is computable for rpm and tpm.

Live: a row counts until its `expires_at` (refreshed by each look of its job; a workflow that
is gone stops looking) and while its job is neither ended nor asked to cancel. Rows of ended
jobs and expired rows are deleted by `sweep` (the waker's periodic pass) and by the claim of their
key; admission ignores them meanwhile, so a stale row never blocks the others.

Wake-ups: the transaction that ends a call (its lease, its unused tokens) sends
`pg_notify(CHANNEL, <key as JSON>)` (`notify_statement`; the key names `platform` or
`key:<credential id>`, never a secret). A waker claims the fair heads that now fit
(`claim_heads`: `woken_at`, under the key's `provider_limit` row lock, so two waker processes
never signal the same waiter; a claim older than CLAIM_TTL_S may be taken again).

Every function runs in the caller's transaction and never commits.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.pipeline import Statement

CHANNEL = "aijobs_limit_freed"
# A job's one call (not a chunk) in the key of `limit_waiter` (its primary key has no NULL).
WHOLE_JOB = -1
# A claimed wake-up that did not turn into a look within this long may be claimed again.
CLAIM_TTL_S = 30.0
# How many waiters a claim looks at (the heads that may fit); more fit only after many calls end.
CLAIM_WINDOW = 64

WaitReason = Literal["rpm", "tpm", "concurrency", "announced"]
_TERMINAL = "('succeeded', 'failed', 'cancelled')"


@dataclass(frozen=True)
class Room:
    """A key's limits and what they hold now (read under its `provider_limit` row lock).
    `requests`/`tokens`: the buckets refilled to now (+inf: unlimited); `free_slots`: None
    without a concurrency limit; `blocked_s` > 0: the provider said nothing is left until then.
    `rpm_reason`/`tpm_reason`: how a wait on that bucket is named (`announced` when the
    provider's limit is the lower one)."""

    rpm: int | None = None
    tpm: int | None = None
    requests: float = math.inf
    tokens: float = math.inf
    free_slots: int | None = None
    slot_in_s: float = 0.0  # when the first lease in flight expires (0: none)
    blocked_s: float = 0.0
    rpm_reason: WaitReason = "rpm"
    tpm_reason: WaitReason = "tpm"
    read_at: Any = None  # the database's clock when the buckets were read
    # Calls in flight per class (read only under a concurrency limit with a reserve).
    in_flight: Mapping[str, int] = field(default_factory=dict)

    def need(self, tokens: int) -> float:
        """What one call takes from the token bucket: its tokens, at most the bucket's size."""
        return float(tokens) if self.tpm is None else float(min(tokens, self.tpm))


@dataclass(frozen=True)
class Verdict:
    """`reason` None: the call goes now. Otherwise wait `wait_s` (the exact refill of the
    deficit for rpm/tpm, the provider's reset for `announced`; for `concurrency`, which no
    clock predicts, when the first lease in flight expires: its latest end)."""

    wait_s: float = 0.0
    reason: WaitReason | None = None


@dataclass(frozen=True)
class HeldBack:
    """Room kept for the waiting calls of other classes beyond the waiters ahead of a caller
    (their reserved parts, db/limit_classes.py): slots, requests and tokens."""

    slots: int = 0
    requests: int = 0
    tokens: float = 0.0


def verdict(
    room: Room, ahead: int, ahead_tokens: float, tokens: int, held: HeldBack = HeldBack()
) -> Verdict:
    """The admission rule: room for `tokens` after reserving room for the `ahead` waiters
    ahead of the caller (`ahead_tokens`: their needs, each capped at the bucket) and for what
    `held` keeps for other classes."""
    if room.blocked_s > 0:
        return Verdict(room.blocked_s, "announced")
    wait_s, reason = 0.0, None
    requests = ahead + held.requests
    if room.rpm is not None and room.requests < requests + 1:
        wait_s, reason = (requests + 1 - room.requests) * 60.0 / room.rpm, room.rpm_reason
    if room.tpm is not None:
        want = ahead_tokens + held.tokens + room.need(tokens)
        if room.tokens < want and (want - room.tokens) * 60.0 / room.tpm > wait_s:
            wait_s, reason = (want - room.tokens) * 60.0 / room.tpm, room.tpm_reason
    if reason is not None:
        return Verdict(wait_s, reason)
    if room.free_slots is not None and room.free_slots <= ahead + held.slots:
        return Verdict(room.slot_in_s, "concurrency")
    return Verdict()


@dataclass(frozen=True)
class WaiterId:
    """Who waits: the job, its chunk (None: the job's one call) and its user (the lane)."""

    job_id: uuid.UUID
    chunk_no: int | None = None
    user_id: str = ""
    job_class: str | None = None  # interactive, background (engine/capacity.py)

    def params(self) -> dict[str, Any]:
        chunk = WHOLE_JOB if self.chunk_no is None else self.chunk_no
        return {
            "job": self.job_id,
            "chunk": chunk,
            "user": self.user_id[:128],
            "klass": self.job_class,
        }


@dataclass(frozen=True)
class Head:
    """A waiter at the front of its key's fair queue, as a claim sees it."""

    job_id: uuid.UUID
    chunk_no: int
    workflow_id: str
    tokens: int
    claimed: bool  # woken less than CLAIM_TTL_S ago: its wake-up is on its way
    job_class: str | None = None


_LIVE_WHERE = f"""
        w.provider = :p AND w.model = :m AND w.key_ref = :k
          AND w.expires_at > clock_timestamp()
          AND NOT EXISTS (
              SELECT 1 FROM ai_job j WHERE j.id = w.job_id
                AND (j.lifecycle_status IN {_TERMINAL} OR j.cancel_requested_at IS NOT NULL))
"""
_LIVE = f"""
    live AS (
        SELECT w.job_id, w.chunk_no, w.user_id, w.workflow_id, w.tokens, w.turn, w.seq,
               w.woken_at, w.job_class
        FROM limit_waiter w WHERE {_LIVE_WHERE}
    )
"""
# The turn a new waiter of `:user` gets: one after its user's last live waiter's, or (its user
# has none) the current turn, the lowest live one: never ahead of a turn already being served.
_NEW_TURN = """
    coalesce((SELECT max(turn) + 1 FROM live
              WHERE user_id = :user AND NOT (job_id = :job AND chunk_no = :chunk)),
             (SELECT min(turn) FROM live), 0)
"""
# A caller not in the queue stands where it would enter: its new turn, after every waiter of it.
_AHEAD = text(
    "WITH "
    + _LIVE
    + """,
    me AS (
        SELECT coalesce((SELECT turn FROM live WHERE job_id = :job AND chunk_no = :chunk),
                        """
    + _NEW_TURN
    + """) AS turn,
               coalesce((SELECT seq FROM live WHERE job_id = :job AND chunk_no = :chunk),
                        9223372036854775807) AS seq
    )
    SELECT count(*) AS n, coalesce(sum(least(l.tokens, :cap)), 0) AS tokens,
           EXISTS (SELECT 1 FROM limit_waiter
                   WHERE job_id = :job AND chunk_no = :chunk) AS queued
    FROM live l, me WHERE (l.turn, l.seq) < (me.turn, me.seq)
    """
)
# Waiters of a class with a reserved part (`:reserved`, empty: none) come first, each class's
# in the fair order (db/limit_classes.py).
# `_AHEAD` per class, with each class's live waiters (the caller left out): the class-aware
# order puts the waiters of the `:reserved` classes first (db/limit_classes.py).
_AHEAD_BY_CLASS = text(
    "WITH "
    + _LIVE
    + """,
    me AS (
        SELECT coalesce(CAST(:klass AS text) = ANY(CAST(:reserved AS text[])), false) AS first,
               coalesce((SELECT turn FROM live WHERE job_id = :job AND chunk_no = :chunk),
                        """
    + _NEW_TURN
    + """) AS turn,
               coalesce((SELECT seq FROM live WHERE job_id = :job AND chunk_no = :chunk),
                        9223372036854775807) AS seq
    ),
    others AS (
        SELECT l.*, coalesce(l.job_class = ANY(CAST(:reserved AS text[])), false) AS first
        FROM live l WHERE NOT (l.job_id = :job AND l.chunk_no = :chunk)
    )
    SELECT q.queued, c.job_class, coalesce(c.n, 0) AS n, coalesce(c.tokens, 0) AS tokens,
           coalesce(c.waiting, 0) AS waiting
    FROM (SELECT EXISTS (SELECT 1 FROM limit_waiter
                         WHERE job_id = :job AND chunk_no = :chunk) AS queued) q
    LEFT JOIN (
        SELECT o.job_class,
               count(*) FILTER (WHERE (NOT o.first, o.turn, o.seq)
                                      < (NOT me.first, me.turn, me.seq)) AS n,
               sum(least(o.tokens, :cap)) FILTER (WHERE (NOT o.first, o.turn, o.seq)
                                                  < (NOT me.first, me.turn, me.seq)) AS tokens,
               count(*) AS waiting
        FROM others o, me GROUP BY o.job_class) c ON TRUE
    """
)
_HEADS = text(
    "WITH "
    + _LIVE
    + """
    SELECT job_id, chunk_no, workflow_id, tokens,
           coalesce(woken_at > clock_timestamp() - make_interval(secs => :ttl), false) AS claimed,
           job_class
    FROM live
    ORDER BY coalesce(job_class = ANY(CAST(:reserved AS text[])), false) DESC, turn, seq
    LIMIT :n
    """
)
_ENQUEUE = text(
    "WITH "
    + _LIVE
    + """
    INSERT INTO limit_waiter AS w (job_id, chunk_no, provider, model, key_ref, user_id,
        workflow_id, tokens, turn, expires_at, job_class)
    SELECT CAST(:job AS uuid), CAST(:chunk AS integer), CAST(:p AS varchar),
           CAST(:m AS varchar), CAST(:k AS varchar), CAST(:user AS varchar),
           CAST(:wf AS varchar), CAST(:tokens AS bigint), """
    + _NEW_TURN
    + """, clock_timestamp() + make_interval(secs => :ttl), CAST(:klass AS varchar)
    ON CONFLICT (job_id, chunk_no) DO UPDATE SET
        provider = EXCLUDED.provider, model = EXCLUDED.model, key_ref = EXCLUDED.key_ref,
        user_id = EXCLUDED.user_id, workflow_id = EXCLUDED.workflow_id,
        tokens = EXCLUDED.tokens, expires_at = EXCLUDED.expires_at, woken_at = NULL,
        job_class = EXCLUDED.job_class
    RETURNING (xmax = 0) AS entered
    """
)
_LEAVE = text("DELETE FROM limit_waiter WHERE job_id = :job AND chunk_no = :chunk")
_CLAIM = text(
    """
    UPDATE limit_waiter SET woken_at = clock_timestamp()
    WHERE (job_id, chunk_no) IN (
        SELECT * FROM unnest(CAST(:jobs AS uuid[]), CAST(:chunks AS integer[])))
    RETURNING workflow_id
    """
)
_SWEEP_KEY = text(
    f"""
    DELETE FROM limit_waiter w
    WHERE w.provider = :p AND w.model = :m AND w.key_ref = :k
      AND (w.expires_at <= clock_timestamp() OR EXISTS (
          SELECT 1 FROM ai_job j WHERE j.id = w.job_id
            AND (j.lifecycle_status IN {_TERMINAL} OR j.cancel_requested_at IS NOT NULL)))
    """
)
_SWEEP = text(
    f"""
    DELETE FROM limit_waiter w
    WHERE w.expires_at <= clock_timestamp() OR EXISTS (
          SELECT 1 FROM ai_job j WHERE j.id = w.job_id
            AND (j.lifecycle_status IN {_TERMINAL} OR j.cancel_requested_at IS NOT NULL))
    """
)
_KEYS = text("SELECT DISTINCT provider, model, key_ref FROM limit_waiter")
_NOTIFY = text("SELECT pg_notify(:channel, :payload)")


def _key(params: dict[str, str]) -> dict[str, str]:
    return {"p": params["p"], "m": params["m"], "k": params["k"]}


async def ahead(
    s: AsyncSession, key_params: dict[str, str], who: WaiterId, *, cap_tokens: int | None
) -> tuple[int, float, bool]:
    """How many live waiters stand ahead of `who` in its key's fair order, their token needs
    (each capped at `cap_tokens`, the bucket's size; None: uncapped), and whether `who` has a
    row in the queue (of any key, live or not: the row its admission deletes)."""
    cap = cap_tokens if cap_tokens is not None else 2**62
    row = (await s.execute(_AHEAD, {**_key(key_params), **who.params(), "cap": cap})).one()
    return int(row.n), float(row.tokens), bool(row.queued)


@dataclass(frozen=True)
class ClassAhead:
    """The live waiters of one class as a caller sees them: how many stand ahead of it in the
    class-aware order, their token needs, and how many wait in all (the caller left out)."""

    job_class: str | None
    ahead: int
    ahead_tokens: float
    waiting: int


async def ahead_by_class(
    s: AsyncSession,
    key_params: dict[str, str],
    who: WaiterId,
    *,
    cap_tokens: int | None,
    reserved: Sequence[str],
) -> tuple[list[ClassAhead], bool]:
    """`ahead` per class, in the order that serves the `reserved` classes' waiters first, and
    whether `who` has a row in the queue."""
    cap = cap_tokens if cap_tokens is not None else 2**62
    params = {**_key(key_params), **who.params(), "cap": cap, "reserved": list(reserved)}
    rows = (await s.execute(_AHEAD_BY_CLASS, params)).all()
    found = [
        ClassAhead(r.job_class, int(r.n), float(r.tokens), int(r.waiting))
        for r in rows
        if r.waiting
    ]
    return found, bool(rows[0].queued)


async def enqueue(
    s: AsyncSession,
    key_params: dict[str, str],
    who: WaiterId,
    *,
    workflow_id: str,
    tokens: int,
    ttl_s: float,
) -> bool:
    """`who` waits in its key's queue: it enters at the end of its user's lane, or keeps its
    place (its wake-up claim cleared, its expiry pushed `ttl_s` on). True: it just entered."""
    params = {**_key(key_params), **who.params(), "wf": workflow_id[:255], "tokens": tokens}
    return bool((await s.execute(_ENQUEUE, {**params, "ttl": ttl_s})).scalar_one())


async def leave(s: AsyncSession, who: WaiterId) -> None:
    """`who` is no longer waiting (its call was admitted)."""
    await s.execute(_LEAVE, who.params())


async def heads(
    s: AsyncSession,
    key_params: dict[str, str],
    n: int = CLAIM_WINDOW,
    *,
    reserved: Sequence[str] = (),
) -> list[Head]:
    """The first `n` live waiters of a key, in the fair order (those of the `reserved`
    classes first)."""
    params = {**_key(key_params), "ttl": CLAIM_TTL_S, "n": n, "reserved": list(reserved)}
    rows = await s.execute(_HEADS, params)
    return [
        Head(r.job_id, r.chunk_no, r.workflow_id, int(r.tokens), bool(r.claimed), r.job_class)
        for r in rows
    ]


HoldFor = Callable[[int, Sequence[Head]], HeldBack]


def fitting(room: Room, queue: Sequence[Head], held: HoldFor | None = None) -> list[Head]:
    """The heads that fit now, in order: each admitted by `verdict` after those before it (and
    after what `held(i, queue)` keeps for other classes' waiters); the first that does not
    fit ends the walk (nobody behind it may pass)."""
    out: list[Head] = []
    need = 0.0
    for i, h in enumerate(queue):
        kept = held(i, queue) if held is not None else HeldBack()
        if verdict(room, i, need, h.tokens, kept).reason is not None:
            break
        out.append(h)
        need += room.need(h.tokens)
    return out


async def claim(s: AsyncSession, chosen: Sequence[Head]) -> list[str]:
    """Mark `chosen` woken now; their workflow ids (once each)."""
    todo = [h for h in chosen if not h.claimed]
    if not todo:
        return []
    params = {"jobs": [h.job_id for h in todo], "chunks": [h.chunk_no for h in todo]}
    rows = (await s.execute(_CLAIM, params)).scalars().all()
    return sorted(set(rows))


async def sweep_key(s: AsyncSession, key_params: dict[str, str]) -> None:
    """Drop a key's expired waiters and those of ended or cancelled jobs."""
    await s.execute(_SWEEP_KEY, _key(key_params))


async def sweep(s: AsyncSession) -> int:
    """Drop every expired waiter and those of ended or cancelled jobs; how many went."""
    result: Any = await s.execute(_SWEEP)
    return int(result.rowcount or 0)


async def keys_waiting(s: AsyncSession) -> list[tuple[str, str, str]]:
    """Every (provider, model, key_ref) with a waiter row."""
    rows = await s.execute(_KEYS)
    return [(r.provider, r.model, r.key_ref) for r in rows]


def notify_statement(key_params: dict[str, str]) -> Statement:
    """The NOTIFY that a call of this key ended (delivered when its transaction commits)."""
    payload = json.dumps(_key(key_params), separators=(",", ":"))
    return (_NOTIFY, {"channel": CHANNEL, "payload": payload})


def parse_payload(payload: str) -> tuple[str, str, str] | None:
    """A notification's key; None: not one of ours."""
    try:
        got = json.loads(payload)
        return str(got["p"]), str(got["m"]), str(got["k"])
    except (ValueError, KeyError, TypeError):
        return None
