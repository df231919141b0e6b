"""Recurring jobs: `ai_schedule` rows, their runs, and their events in the job outbox.

The schedule row is the source of truth (owner, job type, input, spec, paused); every change
to it writes an `ai.schedule.sync` or `ai.schedule.trigger` row in `outbox_event` in the same
transaction (the caller's), NOTIFYing the relay as a job's enqueue does. The relay dispatches it
to Temporal outside any transaction (jobs/schedule_dispatch.py). A run is recorded once per
(schedule, scheduled time).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from db import outbox as outbox_db
from engine.schedules import SYNC_EVENT, TRIGGER_EVENT, iso

# The events' `aggregate_type` (a refused run's event carries it too).
AGGREGATE = "schedule"


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
    # Its creator's organisation and teams and its template's tags: each run's job keeps them.
    org_id: str | None = None
    team_ids: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    ttl_s: int | None = None  # each run's job's start-by TTL (None: the defaults)


@dataclass(frozen=True)
class RunRow:
    scheduled_at: datetime
    job_id: uuid.UUID | None
    error_code: str | None
    manual: bool


# Statements interpolate only this module's constants; every value is a bind parameter.
_COLUMNS = (
    "id, user_id, job_type, target_type, target_id, input, priority, credential_mode, "
    "max_cost_usd, interval_s, cron, timezone, overlap, start_at, end_at, paused, created_at, "
    "updated_at, org_id, team_ids, tags, ttl_s"
)
_INSERT = text(
    f"""
    INSERT INTO ai_schedule ({_COLUMNS})
    VALUES (:id, :user_id, :job_type, :target_type, :target_id, :input, :priority,
            :credential_mode, :max_cost_usd, :interval_s, :cron,
            :timezone, :overlap, :start_at, :end_at, :paused, now(), now(), :org_id,
            :team_ids, :tags, :ttl_s)
    """
).bindparams(bindparam("input", type_=JSONB))


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


async def add_sync(
    session: AsyncSession, schedule_id: uuid.UUID, *, trace_context: dict[str, str] | None = None
) -> None:
    """`ai.schedule.sync`: Temporal's schedule is to match the row as it is when the relay
    dispatches the event (or go, if the row is gone). Each change writes its own event (a
    fresh dedupe key): a sync reads the row at dispatch, so any later one converges."""
    await outbox_db.insert(
        session,
        event_type=SYNC_EVENT,
        aggregate_type=AGGREGATE,
        aggregate_id=str(schedule_id),
        dedupe_key=f"{SYNC_EVENT}:{schedule_id}:{uuid.uuid4().hex}",
        payload={"scheduleId": str(schedule_id)},
        trace_context=trace_context,
    )


async def add_trigger(
    session: AsyncSession,
    schedule_id: uuid.UUID,
    at: datetime,
    *,
    trace_context: dict[str, str] | None = None,
) -> None:
    """`ai.schedule.trigger`: one run of the schedule at `at` (its scheduled time and key)."""
    await outbox_db.insert(
        session,
        event_type=TRIGGER_EVENT,
        aggregate_type=AGGREGATE,
        aggregate_id=str(schedule_id),
        dedupe_key=f"{TRIGGER_EVENT}:{schedule_id}:{iso(at)}",
        payload={"scheduleId": str(schedule_id), "scheduledAt": iso(at)},
        trace_context=trace_context,
    )


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


async def get_run(
    session: AsyncSession, schedule_id: uuid.UUID, scheduled_at: datetime
) -> RunRow | None:
    """The run recorded for (schedule, scheduled time), if any."""
    r = await session.execute(
        text(
            "SELECT scheduled_at, job_id, error_code, manual FROM ai_schedule_run "
            "WHERE schedule_id = :sid AND scheduled_at = :at"
        ),
        {"sid": schedule_id, "at": scheduled_at},
    )
    m = r.mappings().first()
    return RunRow(**m) if m is not None else None


async def purge_runs(session: AsyncSession, *, days: float, limit: int = 5000) -> int:
    """Run rows recorded more than `days` ago (DATA_RETENTION_DAYS), oldest first, at most
    `limit` (`ix_ai_schedule_run_created` serves the page)."""
    r = await session.execute(
        text(
            """
            DELETE FROM ai_schedule_run WHERE (schedule_id, scheduled_at) IN (
                SELECT schedule_id, scheduled_at FROM ai_schedule_run
                WHERE created_at < now() - make_interval(secs => :s)
                ORDER BY created_at LIMIT :lim)
            """
        ),
        {"s": days * 86_400, "lim": limit},
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
        VALUES (:type, :agg, :sid, :dedupe, :payload, 'published', 0, now(), now(), now())
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
            "agg": AGGREGATE,
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
            "WHERE id = :id AND event_type = :t AND aggregate_type = :agg"
        ),
        {"id": event_id, "t": event_type, "agg": AGGREGATE},
    )
    value = r.scalar_one_or_none()
    return dict(value) if isinstance(value, dict) else None


async def existing(session: AsyncSession, ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """Those of `ids` that still have their row."""
    r = await session.execute(
        text("SELECT id FROM ai_schedule WHERE id = ANY(:ids)"), {"ids": list(ids)}
    )
    return {row.id for row in r}


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
