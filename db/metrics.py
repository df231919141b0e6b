"""The engine's state as the metrics endpoint reads it at scrape time: jobs and outbox rows by
state. Every query is served by an index (tests/integration/test_metrics_sql.py checks the
plans), so a scrape costs what the backlog costs, never a scan of the history."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from engine.lifecycle import ACTIVE_VALUES, TERMINAL_VALUES


def _sql_list(values: tuple[str, ...]) -> str:
    """An SQL list of our own constant state names (never user input): `'a', 'b'`."""
    return ", ".join(f"'{v}'" for v in values)


# The scrape-time reads; each is served by an index (tests/integration/test_metrics_sql.py).
ACTIVE_JOBS_SQL = (
    "SELECT job_type, lifecycle_status, count(*) AS n FROM ai_job "
    f"WHERE lifecycle_status IN ({_sql_list(ACTIVE_VALUES)}) GROUP BY 1, 2"
)
RECENT_JOBS_SQL = (
    "SELECT job_type, lifecycle_status, count(*) AS n FROM ai_job "
    f"WHERE lifecycle_status IN ({_sql_list(TERMINAL_VALUES)}) "
    "AND created_at >= now() - make_interval(secs => :w) GROUP BY 1, 2"
)
# One arm per partial index (pending; processing; dead and failed): an IN list over all four
# states would match none of their predicates and scan the table, published rows included.
OUTBOX_SQL = (
    "SELECT event_type, status, count(*) AS n FROM outbox_event "
    "WHERE status = 'pending' GROUP BY 1, 2 "
    "UNION ALL SELECT event_type, status, count(*) FROM outbox_event "
    "WHERE status = 'processing' GROUP BY 1, 2 "
    "UNION ALL SELECT event_type, status, count(*) FROM outbox_event "
    "WHERE status IN ('dead', 'failed') GROUP BY 1, 2"
)
# A row waits from when it is due: its creation, or a delayed job's start when that is later
# (never tried yet: a retried row's backoff still counts). Held rows wait by design.
OLDEST_PENDING_SQL = (
    "SELECT coalesce(extract(epoch FROM now() - min(CASE WHEN attempt_count = 0 "
    "THEN greatest(created_at, available_at) ELSE created_at END)), 0) "
    "FROM outbox_event WHERE status = 'pending' AND held_at IS NULL"
)


@dataclass
class EngineState:
    active: dict[tuple[str, str], int] = field(default_factory=dict)  # (job_type, status)
    recent: dict[tuple[str, str], int] = field(default_factory=dict)  # (job_type, status)
    outbox: dict[tuple[str, str], int] = field(default_factory=dict)  # (event_type, status)
    oldest_pending_s: float = 0.0


async def read_engine_state(
    session: AsyncSession, *, recent_window_s: float, timeout_s: float
) -> EngineState:
    """Active jobs, terminal jobs created within `recent_window_s`, outbox rows that are not
    published, and the age of the oldest pending row; each statement bounded by `timeout_s`.
    Runs in the caller's transaction (the statement timeout is local to it)."""
    state = EngineState()
    timeout_ms = max(1, int(timeout_s * 1000))
    # SET takes no bind parameter; set_config(..., is_local => true) is SET LOCAL that does.
    await session.execute(
        text("SELECT set_config('statement_timeout', :ms, true)"), {"ms": str(timeout_ms)}
    )
    for r in await session.execute(text(ACTIVE_JOBS_SQL)):
        state.active[(r.job_type, r.lifecycle_status)] = int(r.n)
    for r in await session.execute(text(RECENT_JOBS_SQL), {"w": recent_window_s}):
        state.recent[(r.job_type, r.lifecycle_status)] = int(r.n)
    for r in await session.execute(text(OUTBOX_SQL)):
        state.outbox[(r.event_type, r.status)] = int(r.n)
    age = await session.scalar(text(OLDEST_PENDING_SQL))
    state.oldest_pending_s = max(0.0, float(age or 0))
    return state
