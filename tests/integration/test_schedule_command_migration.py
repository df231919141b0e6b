"""The migration that moved a schedule's commands into the job outbox, on a database of its own
migrated to just before it: pending commands become outbox events (a trigger keeps its time,
syncs become one per schedule, and every schedule gets one so that its Temporal schedule moves
to `ai-schedules`), finished ones are dropped with `ai_schedule_command`; the downgrade puts the
pending events back as commands."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from alembic import command
from sqlalchemy import Connection, create_engine, pool, text
from sqlalchemy.engine import make_url

from db.migrate import alembic_config, upgrade
from db.session import sqlalchemy_url

BEFORE = "0028"
TRIGGER_AT = datetime(2026, 3, 1, 12, 30, 15, 250000, tzinfo=UTC)


@pytest.fixture
def fresh_db(database_url: str) -> Iterator[str]:
    name = f"aijobs_migration_{uuid.uuid4().hex[:8]}"
    admin = create_engine(
        sqlalchemy_url(database_url), poolclass=pool.NullPool, isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as c:
        c.execute(text(f"CREATE DATABASE {name}"))
    url = make_url(database_url).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as c:
            c.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()


def _connect(url: str) -> Connection:
    return create_engine(sqlalchemy_url(url), poolclass=pool.NullPool).connect()


def test_pending_commands_move_into_the_outbox_and_back(fresh_db: str) -> None:
    upgrade(fresh_db, BEFORE)
    triggered, synced, idle, gone = (uuid.uuid4() for _ in range(4))
    with _connect(fresh_db) as c:
        for sid in (triggered, synced, idle):
            c.execute(
                text(
                    "INSERT INTO ai_schedule (id, user_id, job_type, target_type, target_id, "
                    "input, interval_s) VALUES (:s, 'u1', 'synthetic', 'schedule', 't', "
                    "'{}'::jsonb, 3600)"
                ),
                {"s": sid},
            )
        commands = [
            (triggered, "trigger", TRIGGER_AT, None),
            (triggered, "trigger", TRIGGER_AT.replace(hour=1), "now()"),  # done: not moved
            (synced, "sync", None, None),
            (synced, "sync", None, None),
            (gone, "sync", None, None),  # a delete's sync: the row is gone, the command stays
        ]
        for sid, cmd, at, done in commands:
            c.execute(
                text(
                    "INSERT INTO ai_schedule_command (schedule_id, command, run_at, done_at) "
                    f"VALUES (:s, :c, :at, {done or 'NULL'})"
                ),
                {"s": sid, "c": cmd, "at": at},
            )
        c.commit()

    upgrade(fresh_db)
    with _connect(fresh_db) as c:
        assert c.execute(text("SELECT to_regclass('ai_schedule_command')")).scalar() is None
        events = c.execute(
            text(
                "SELECT event_type, aggregate_type, aggregate_id, payload, status "
                "FROM outbox_event ORDER BY event_type, aggregate_id"
            )
        ).all()
    assert sorted(
        (e.event_type, e.aggregate_id, e.status) for e in events if e.event_type.endswith("sync")
    ) == sorted(("ai.schedule.sync", str(s), "pending") for s in (triggered, synced, idle, gone))
    [trigger] = [e for e in events if e.event_type == "ai.schedule.trigger"]
    assert (trigger.aggregate_type, trigger.aggregate_id) == ("schedule", str(triggered))
    assert trigger.payload["scheduleId"] == str(triggered)
    assert datetime.fromisoformat(trigger.payload["scheduledAt"]) == TRIGGER_AT

    cfg = alembic_config(fresh_db)
    command.downgrade(cfg, BEFORE)
    with _connect(fresh_db) as c:
        back = c.execute(text("SELECT schedule_id, command, run_at FROM ai_schedule_command")).all()
        left = c.execute(text("SELECT count(*) FROM outbox_event")).scalar_one()
    assert sorted((str(b.schedule_id), b.command, b.run_at) for b in back) == sorted(
        [(str(triggered), "trigger", TRIGGER_AT)]
        + [(str(s), "sync", None) for s in (triggered, synced, idle, gone)]
    )
    assert left == 0
