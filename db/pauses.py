"""Operator pauses (`ai_pause`), the jobs they hold (`ai_pause_hold`) and the pace of their
release (`ai_resume_pace`): docs/admin.md "Operator pauses". Every function runs in the caller's
session and never commits.

Why a pause holds from the moment its POST answered: a pause is written under an exclusive
transaction-scoped advisory lock, and every EXECUTE reads the pauses in force in its first
transaction after taking the same lock shared (`LOCK_SHARED`, `IN_FORCE`, pipelined in its take:
db/attempts.py). The POST's commit therefore waits for the admissions already reading, and every
admission after it sees the pause: once the POST answered, no call of a matching job starts. A
delete and an expiry take the lock too, so a job held just before a delete is seen by the
release that follows it. Each of the three notifies `PAUSE_CHANNEL` (the pause waker wakes).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from db.lifecycle import ACTIVE_SQL
from engine.flow import PAUSE_CHANNEL, PauseMatch

_LOCK_KEY = "hashtextextended('aijobs:pauses', 0)"
LOCK_SHARED = text(f"SELECT pg_advisory_xact_lock_shared({_LOCK_KEY})")
LOCK_EXCLUSIVE = text(f"SELECT pg_advisory_xact_lock({_LOCK_KEY})")
# The pauses in force: usually none (an empty table, one index-only probe).
IN_FORCE = text(
    "SELECT job_type, provider, model, user_id, expires_at FROM ai_pause "
    "WHERE expires_at IS NULL OR expires_at > now()"
)
_COLUMNS = "id, job_type, provider, model, user_id, reason, expires_at, created_at, created_by"
_NOTIFY = f"pg_notify('{PAUSE_CHANNEL}', '') IS NULL AS notified"


@dataclass(frozen=True)
class InForce:
    """A pause in force as EXECUTE matches it: its members and its end (None: until lifted)."""

    match: PauseMatch
    expires_at: datetime | None


def in_force_of(rows: list[dict[str, Any]]) -> tuple[InForce, ...]:
    """`IN_FORCE`'s rows (mappings) as pauses."""
    return tuple(
        InForce(PauseMatch(r["job_type"], r["provider"], r["model"], r["user_id"]), r["expires_at"])
        for r in rows
    )


async def in_force(s: AsyncSession) -> tuple[InForce, ...]:
    """The pauses in force, read after the pauses' lock is taken shared."""
    await s.execute(LOCK_SHARED)
    rows = (await s.execute(IN_FORCE)).mappings().all()
    return in_force_of([dict(r) for r in rows])


@dataclass(frozen=True)
class PauseRow:
    id: uuid.UUID
    job_type: str | None
    provider: str | None
    model: str | None
    user_id: str | None
    reason: str
    expires_at: datetime | None
    created_at: datetime
    created_by: str


def _row(r: Any) -> PauseRow:
    return PauseRow(**{k: v for k, v in r._mapping.items() if k != "notified"})


async def create(
    s: AsyncSession,
    pause_id: uuid.UUID,
    match: PauseMatch,
    *,
    reason: str,
    expires_at: datetime | None,
    created_by: str,
) -> PauseRow:
    """Insert a pause under the exclusive lock (module text), notifying the pause wakers."""
    await s.execute(LOCK_EXCLUSIVE)
    row = (
        await s.execute(
            text(
                "INSERT INTO ai_pause (id, job_type, provider, model, user_id, reason, "
                "expires_at, created_by) VALUES (:id, :job_type, :provider, :model, :user_id, "
                f":reason, :expires_at, :created_by) RETURNING {_COLUMNS}, {_NOTIFY}"
            ),
            {
                "id": pause_id,
                "job_type": match.job_type,
                "provider": match.provider,
                "model": match.model,
                "user_id": match.user_id,
                "reason": reason,
                "expires_at": expires_at,
                "created_by": created_by,
            },
        )
    ).one()
    return _row(row)


async def listed(s: AsyncSession) -> list[PauseRow]:
    """The pauses in force, oldest first."""
    rows = await s.execute(
        text(
            f"SELECT {_COLUMNS} FROM ai_pause WHERE expires_at IS NULL OR expires_at > now() "
            "ORDER BY created_at, id"
        )
    )
    return [PauseRow(**r._mapping) for r in rows]


async def delete(s: AsyncSession, pause_id: uuid.UUID) -> PauseRow | None:
    """Lift a pause in force (None: no such pause, or it expired), under the exclusive lock."""
    await s.execute(LOCK_EXCLUSIVE)
    row = (
        await s.execute(
            text(
                "DELETE FROM ai_pause WHERE id = :id "
                "AND (expires_at IS NULL OR expires_at > now()) "
                f"RETURNING {_COLUMNS}, {_NOTIFY}"
            ),
            {"id": pause_id},
        )
    ).first()
    return _row(row) if row is not None else None


async def expire(s: AsyncSession) -> list[PauseRow]:
    """Lift every pause whose `expires_at` passed (`ix_ai_pause_expires`), under the exclusive
    lock; the rows lifted (a concurrent expiry lifts each once)."""
    await s.execute(LOCK_EXCLUSIVE)
    rows = await s.execute(
        text(
            "DELETE FROM ai_pause WHERE expires_at IS NOT NULL AND expires_at <= now() "
            f"RETURNING {_COLUMNS}, {_NOTIFY}"
        )
    )
    return [_row(r) for r in rows]


async def next_expiry_s(s: AsyncSession) -> float | None:
    """Seconds until the next pause in force expires (None: none will)."""
    row = (
        await s.execute(
            text(
                "SELECT extract(epoch FROM min(expires_at) - clock_timestamp()) AS s "
                "FROM ai_pause WHERE expires_at IS NOT NULL"
            )
        )
    ).one()
    return None if row.s is None else float(row.s)


# ---- the jobs a pause holds -------------------------------------------------------------


async def hold(
    s: AsyncSession,
    job_id: uuid.UUID,
    *,
    user_id: str,
    workflow_id: str,
    job_type: str,
    provider: str,
    model: str,
) -> bool:
    """The job is held (what its call was held for), its turn fixed (`AiPauseHold.turn`);
    False: it already was."""
    result = await s.execute(
        text(
            "INSERT INTO ai_pause_hold "
            "(job_id, user_id, workflow_id, job_type, provider, model, turn) "
            "VALUES (:job_id, CAST(:user_id AS varchar), :wf, :job_type, :provider, :model, "
            "coalesce("
            "(SELECT max(turn) + 1 FROM ai_pause_hold WHERE user_id = CAST(:user_id AS varchar)), "
            "(SELECT min(turn) FROM ai_pause_hold), 0)) "
            "ON CONFLICT (job_id) DO NOTHING"
        ),
        {
            "job_id": job_id,
            "user_id": user_id,
            "wf": workflow_id,
            "job_type": job_type,
            "provider": provider,
            "model": model,
        },
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


# A held job no pause in force matches any more (what it was held for), whose job is active.
_FREE = f"""
    SELECT h.job_id, h.turn, h.held_at FROM ai_pause_hold h
    JOIN ai_job j ON j.id = h.job_id AND j.{ACTIVE_SQL}
    WHERE NOT EXISTS (
        SELECT 1 FROM ai_pause p
        WHERE (p.expires_at IS NULL OR p.expires_at > now())
          AND (p.job_type IS NULL OR p.job_type = h.job_type)
          AND (p.provider IS NULL OR p.provider = h.provider)
          AND (p.model IS NULL OR p.model = h.model)
          AND (p.user_id IS NULL OR p.user_id = h.user_id))
"""
# Up to :n of them in fair order (each user's first, then each user's second, ...: their turns),
# deleted; their workflows to wake.
_RELEASE = text(
    f"""
    WITH free AS ({_FREE}),
    picked AS (SELECT job_id FROM free ORDER BY turn, held_at, job_id LIMIT :n),
    gone AS (
        DELETE FROM ai_pause_hold h USING picked WHERE h.job_id = picked.job_id
        RETURNING h.workflow_id, h.turn, h.held_at, h.job_id)
    SELECT workflow_id FROM gone ORDER BY turn, held_at, job_id
    """
)
_MORE = text(f"SELECT EXISTS ({_FREE}) AS more")
# Holds of jobs that ended (cancelled or expired while held) have nothing left to wake.
_SWEEP = text(
    f"DELETE FROM ai_pause_hold h WHERE NOT EXISTS "
    f"(SELECT 1 FROM ai_job j WHERE j.id = h.job_id AND j.{ACTIVE_SQL})"
)
# The pace: one row, the time of the next free release slot. Releases are spaced 1/rate apart
# across every process: a pass reserves the slots of the jobs it releases (up to a second's
# worth) from that time on, under the row's lock.
_PACE = text(
    "INSERT INTO ai_resume_pace (id, next_at) VALUES (1, clock_timestamp()) "
    "ON CONFLICT (id) DO NOTHING"
)
_PACE_READ = text(
    "SELECT extract(epoch FROM greatest(next_at, clock_timestamp()) - clock_timestamp()) "
    "AS ahead FROM ai_resume_pace WHERE id = 1 FOR UPDATE"
)
_PACE_WRITE = text(
    "UPDATE ai_resume_pace SET next_at = clock_timestamp() + make_interval(secs => :ahead) "
    "WHERE id = 1"
)


@dataclass(frozen=True)
class Released:
    """A release pass: the workflows to wake, each with the seconds from now to its slot (in
    fair order, 1/rate apart), whether more held jobs may go, and how long until the next pass
    may reserve slots."""

    slots: list[tuple[str, float]]
    more: bool
    next_in_s: float

    @property
    def workflow_ids(self) -> list[str]:
        return [wf for wf, _ in self.slots]


async def release(s: AsyncSession, rate: float) -> Released:
    """Release the held jobs no pause matches any more, in fair order, at most `rate` a second
    across every process: up to a second's worth, each given its slot (the pace row is locked:
    passes are serialised, and a pass whose slots would start more than a second ahead releases
    nothing). Holds of ended jobs are swept on the way."""
    await s.execute(_SWEEP)
    await s.execute(_PACE)
    ahead = max(float((await s.execute(_PACE_READ)).scalar_one()), 0.0)
    ids: list[str] = []
    if ahead < 1.0:
        n = max(1, math.ceil(rate))
        ids = list((await s.execute(_RELEASE, {"n": n})).scalars())
        slots = [(wf, ahead + i / rate) for i, wf in enumerate(ids)]
        ahead += len(ids) / rate
        await s.execute(_PACE_WRITE, {"ahead": ahead})
    else:
        slots = []
    more = bool((await s.execute(_MORE)).scalar())
    return Released(slots, more, max(ahead - 1.0, 0.05))


async def held_count(s: AsyncSession) -> int:
    """How many jobs are held (tests, the console)."""
    return int((await s.execute(text("SELECT count(*) FROM ai_pause_hold"))).scalar_one())
