"""Recurring jobs: `ai_schedule` rows, their runs and their commands to Temporal.

The schedule row is the source of truth (owner, job type, input, spec, paused); every change
to it writes an `ai_schedule_command` row in the same transaction (the caller's), which a
dispatcher claims (`FOR UPDATE SKIP LOCKED`, a lease in `locked_until`) and applies to Temporal
outside any transaction. A run is recorded once per (schedule, scheduled time).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

SYNC = "sync"
TRIGGER = "trigger"


@dataclass(frozen=True)
class ScheduleRow:
    id: uuid.UUID
    user_id: str
    job_type: str
    target_type: str
    target_id: str
    input: dict[str, Any]
    priority: int | None
    credential_mode: str | None
    max_cost_usd: Decimal | None
    interval_s: int | None
    cron: str | None
    timezone: str
    overlap: str
    start_at: datetime | None
    end_at: datetime | None
    paused: bool
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class RunRow:
    scheduled_at: datetime
    job_id: uuid.UUID | None
    error_code: str | None
    manual: bool


@dataclass(frozen=True)
class CommandRow:
    id: int
    schedule_id: uuid.UUID
    command: str
    run_at: datetime | None
    attempts: int


# Statements interpolate only this module's constants; every value is a bind parameter.
_COLUMNS = (
    "id, user_id, job_type, target_type, target_id, input, priority, credential_mode, "
    "max_cost_usd, interval_s, cron, timezone, overlap, start_at, end_at, paused, created_at, "
    "updated_at"
)
_INSERT = text(
    f"""
    INSERT INTO ai_schedule ({_COLUMNS})
    VALUES (:id, :user_id, :job_type, :target_type, :target_id, :input, :priority,
            :credential_mode, :max_cost_usd, :interval_s, :cron,
            :timezone, :overlap, :start_at, :end_at, :paused, now(), now())
    """
).bindparams(bindparam("input", type_=JSONB))
_COMMAND = text(
    "INSERT INTO ai_schedule_command (schedule_id, command, run_at) VALUES (:sid, :cmd, :run_at)"
)


async def lock_user(session: AsyncSession, user_id: str) -> None:
    """Serialises one user's schedule creates until the transaction ends (the per-user cap)."""
    await session.execute(
        text("SELECT pg_advisory_xact_lock(hashtext('ai_schedule:' || :u))"), {"u": user_id}
    )


async def count_for_user(session: AsyncSession, user_id: str) -> int:
    r = await session.execute(
        text("SELECT count(*) FROM ai_schedule WHERE user_id = :u"), {"u": user_id}
    )
    return int(r.scalar_one())


async def insert(session: AsyncSession, row: ScheduleRow) -> None:
    values = {k: getattr(row, k) for k in ScheduleRow.__dataclass_fields__}
    values.pop("created_at")
    values.pop("updated_at")
    await session.execute(_INSERT, values)


async def add_command(
    session: AsyncSession, schedule_id: uuid.UUID, command: str, *, run_at: datetime | None = None
) -> None:
    await session.execute(_COMMAND, {"sid": schedule_id, "cmd": command, "run_at": run_at})


async def get(
    session: AsyncSession, schedule_id: uuid.UUID, *, for_update: bool = False
) -> ScheduleRow | None:
    lock = " FOR UPDATE" if for_update else ""
    r = await session.execute(
        text(f"SELECT {_COLUMNS} FROM ai_schedule WHERE id = :id{lock}"), {"id": schedule_id}
    )
    m = r.mappings().first()
    return ScheduleRow(**m) if m is not None else None


async def page(
    session: AsyncSession,
    *,
    user_id: str | None,
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[ScheduleRow]:
    """Newest first; `user_id` None lists everyone's (admins)."""
    r = await session.execute(
        text(
            f"""
            SELECT {_COLUMNS} FROM ai_schedule
            WHERE (CAST(:u AS text) IS NULL OR user_id = :u)
              AND (CAST(:at AS timestamptz) IS NULL OR (created_at, id) < (:at, :aid))
            ORDER BY created_at DESC, id DESC
            LIMIT :limit
            """
        ),
        {
            "u": user_id,
            "at": after[0] if after else None,
            "aid": after[1] if after else None,
            "limit": limit,
        },
    )
    return [ScheduleRow(**m) for m in r.mappings()]


async def set_paused(session: AsyncSession, schedule_id: uuid.UUID, paused: bool) -> None:
    await session.execute(
        text("UPDATE ai_schedule SET paused = :p, updated_at = now() WHERE id = :id"),
        {"p": paused, "id": schedule_id},
    )


async def delete(session: AsyncSession, schedule_id: uuid.UUID) -> bool:
    r = await session.execute(text("DELETE FROM ai_schedule WHERE id = :id"), {"id": schedule_id})
    return bool(r.rowcount)  # type: ignore[attr-defined]


async def record_run(
    session: AsyncSession,
    schedule_id: uuid.UUID,
    scheduled_at: datetime,
    *,
    job_id: uuid.UUID | None,
    error_code: str | None,
    manual: bool,
) -> bool:
    """One row per (schedule, scheduled time): a duplicated fire records nothing more. False
    when it was already recorded or the schedule is gone."""
    r = await session.execute(
        text(
            """
            INSERT INTO ai_schedule_run (schedule_id, scheduled_at, job_id, error_code, manual)
            SELECT id, :at, :job, :code, :manual FROM ai_schedule WHERE id = :sid
            ON CONFLICT (schedule_id, scheduled_at) DO NOTHING
            """
        ),
        {
            "sid": schedule_id,
            "at": scheduled_at,
            "job": job_id,
            "code": error_code,
            "manual": manual,
        },
    )
    return bool(r.rowcount)  # type: ignore[attr-defined]


async def recent_runs(session: AsyncSession, schedule_id: uuid.UUID, limit: int) -> list[RunRow]:
    r = await session.execute(
        text(
            "SELECT scheduled_at, job_id, error_code, manual FROM ai_schedule_run "
            "WHERE schedule_id = :sid ORDER BY scheduled_at DESC LIMIT :limit"
        ),
        {"sid": schedule_id, "limit": limit},
    )
    return [RunRow(**m) for m in r.mappings()]


async def recent_runs_of(
    session: AsyncSession, schedule_ids: Sequence[uuid.UUID], limit: int
) -> dict[uuid.UUID, list[RunRow]]:
    """`recent_runs` of several schedules in one statement (a page of schedules)."""
    if not schedule_ids:
        return {}
    r = await session.execute(
        text(
            """
            SELECT s.sid AS schedule_id, r.scheduled_at, r.job_id, r.error_code, r.manual
            FROM unnest(CAST(:ids AS uuid[])) AS s(sid)
            CROSS JOIN LATERAL (
                SELECT scheduled_at, job_id, error_code, manual FROM ai_schedule_run
                WHERE schedule_id = s.sid ORDER BY scheduled_at DESC LIMIT :limit
            ) AS r
            """
        ),
        {"ids": list(schedule_ids), "limit": limit},
    )
    runs: dict[uuid.UUID, list[RunRow]] = {sid: [] for sid in schedule_ids}
    for m in r.mappings():
        runs[m["schedule_id"]].append(
            RunRow(m["scheduled_at"], m["job_id"], m["error_code"], m["manual"])
        )
    return runs


async def claim_commands(
    session: AsyncSession, *, limit: int, lease_s: float, schedule_id: uuid.UUID | None = None
) -> list[CommandRow]:
    """Due commands, oldest first, leased for `lease_s` (a dispatcher that dies releases them
    when the lease ends); `schedule_id` claims only that schedule's."""
    r = await session.execute(
        text(
            """
            UPDATE ai_schedule_command c
            SET locked_until = now() + make_interval(secs => :lease), attempts = c.attempts + 1
            WHERE c.id IN (
                SELECT id FROM ai_schedule_command
                WHERE done_at IS NULL AND available_at <= now()
                  AND (locked_until IS NULL OR locked_until < now())
                  AND (CAST(:sid AS uuid) IS NULL OR schedule_id = :sid)
                ORDER BY id
                LIMIT :limit
                FOR UPDATE SKIP LOCKED
            )
            RETURNING c.id, c.schedule_id, c.command, c.run_at, c.attempts
            """
        ),
        {"lease": lease_s, "limit": limit, "sid": schedule_id},
    )
    return sorted((CommandRow(**m) for m in r.mappings()), key=lambda c: c.id)


async def mark_applied(session: AsyncSession, ids: Sequence[int]) -> None:
    if ids:
        await session.execute(
            text("UPDATE ai_schedule_command SET done_at = now() WHERE id = ANY(:ids)"),
            {"ids": list(ids)},
        )


async def put_back(
    session: AsyncSession, command_id: int, *, error: str, retry_in_s: float
) -> None:
    await session.execute(
        text(
            """
            UPDATE ai_schedule_command
            SET locked_until = NULL, last_error = :err,
                available_at = now() + make_interval(secs => :delay)
            WHERE id = :id
            """
        ),
        {"id": command_id, "err": error[:300], "delay": retry_in_s},
    )


async def purge_done(session: AsyncSession, *, older_than_s: float) -> int:
    r = await session.execute(
        text("DELETE FROM ai_schedule_command WHERE done_at < now() - make_interval(secs => :s)"),
        {"s": older_than_s},
    )
    return int(r.rowcount)  # type: ignore[attr-defined]


# A refused run's event: written already published (it starts nothing; the relay has nothing to
# do with it), with one delivery per live endpoint of the owner subscribed to its type, in the
# run's own transaction. The delivery's `job_id` column carries the schedule id.
_REFUSED_EVENT = text(
    """
    WITH ev AS (
        INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload,
                                  status, attempt_count, available_at, created_at, published_at)
        VALUES (:type, 'schedule', :sid, :dedupe, :payload, 'published', 0, now(), now(), now())
        ON CONFLICT (dedupe_key) DO NOTHING
        RETURNING id, created_at
    )
    INSERT INTO webhook_delivery (endpoint_id, user_id, event_id, job_id, webhook_id,
                                  event_type, occurred_at, status, attempt_count,
                                  next_attempt_at, created_at)
    SELECT e.id, e.user_id, ev.id, :sid, 'msg_' || ev.id || '_' || replace(e.id::text, '-', ''),
           :type, ev.created_at, 'pending', 0, now(), now()
    FROM ev JOIN webhook_endpoint e ON e.user_id = :u AND e.deleted_at IS NULL
                                    AND e.event_types ? :type
    ON CONFLICT (endpoint_id, event_id) DO NOTHING
    RETURNING pg_notify('ai_webhook', '') IS NULL AS notified
    """
).bindparams(bindparam("payload", type_=JSONB))


async def insert_refused_event(
    session: AsyncSession,
    *,
    event_type: str,
    user_id: str,
    schedule_id: str,
    dedupe_key: str,
    payload: dict[str, Any],
) -> None:
    await session.execute(
        _REFUSED_EVENT,
        {
            "type": event_type,
            "sid": schedule_id,
            "u": user_id,
            "dedupe": dedupe_key,
            "payload": payload,
        },
    )


async def event_payload(
    session: AsyncSession, event_id: int, event_type: str
) -> dict[str, Any] | None:
    """A schedule event's payload (what its webhook carries as `data`)."""
    r = await session.execute(
        text(
            "SELECT payload FROM outbox_event "
            "WHERE id = :id AND event_type = :t AND aggregate_type = 'schedule'"
        ),
        {"id": event_id, "t": event_type},
    )
    value = r.scalar_one_or_none()
    return dict(value) if isinstance(value, dict) else None


async def ids_after(session: AsyncSession, after: uuid.UUID | None, limit: int) -> list[uuid.UUID]:
    """Schedule ids in id order after `after`: the repair's pages."""
    r = await session.execute(
        text(
            "SELECT id FROM ai_schedule WHERE CAST(:after AS uuid) IS NULL OR id > :after "
            "ORDER BY id LIMIT :limit"
        ),
        {"after": after, "limit": limit},
    )
    return [row.id for row in r]
