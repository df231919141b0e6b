"""Engines and session factories. Transactions open at the boundary (one per API write, one per
activity attempt) with `async with sessionmaker.begin()`; repositories never commit."""

from __future__ import annotations

import psycopg
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import text
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

SessionMaker = async_sessionmaker[AsyncSession]

# What a connection tells PostgreSQL it serves (`application_name`, a connection parameter sent
# when it opens, so `pg_stat_activity` names every backend's process): each entry point passes
# its own (`aijobs-api`, `aijobs-worker-ai-system`, ..., runtime/names.py); anything else that
# connects (other commands, tools, tests) is `aijobs-cli`.
DEFAULT_APPLICATION_NAME = "aijobs-cli"


def sqlalchemy_url(url: str) -> str:
    """Accept libpq-style URLs (`postgresql://...`) and use psycopg 3 for them."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def libpq_url(url: str) -> str:
    """The same URL for plain psycopg / libpq tools (the LISTEN connection, pgbench)."""
    for prefix in ("postgresql+psycopg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


def make_engine(
    url: str,
    *,
    pool_size: int = 10,
    max_overflow: int = 20,
    pooled: bool = False,
    application_name: str = DEFAULT_APPLICATION_NAME,
) -> AsyncEngine:
    """`pooled`: `url` is a transaction pooler (PgBouncer), so psycopg never prepares a
    statement on the server (`prepare_threshold=None`): a prepared statement belongs to one
    server session, and the pooler gives the next transaction whichever session is free.
    `application_name` goes with every connection of the pool as it opens."""
    connect_args: dict[str, object] = {"application_name": application_name}
    if pooled:
        connect_args["prepare_threshold"] = None
    return create_async_engine(
        sqlalchemy_url(url),
        connect_args=connect_args,
        pool_size=pool_size,
        max_overflow=max_overflow,
        # No pre-ping: it costs a round trip and a counted transaction on every checkout.
        # A connection lost to a database restart fails its statement instead, SQLAlchemy then
        # invalidates the pool, and the caller's retry (activity retry, HTTP 503) reconnects.
        pool_pre_ping=False,
        pool_recycle=1800,
        # Statement parameters (job input, outputs, key ciphertext) never appear in exception
        # messages, hence never in logs, internal error messages or outbox last_error.
        hide_parameters=True,
    )


def make_sessionmaker(engine: AsyncEngine) -> SessionMaker:
    return async_sessionmaker(engine, expire_on_commit=False)


async def ping(session: AsyncSession) -> None:
    """One round trip: raises when the database cannot be reached."""
    await session.execute(text("SELECT 1"))


def where(url: str) -> str:
    """host:port/dbname of a database URL: what a message may show (never user or password)."""
    try:
        info = conninfo_to_dict(libpq_url(url))
    except psycopg.ProgrammingError:
        return "an unparsable URL"
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


def unreachable(
    url: str, timeout_s: float, *, application_name: str = DEFAULT_APPLICATION_NAME
) -> str | None:
    """None when `SELECT 1` answers on `url` (a start-up check), else the first line of why.
    One statement, never prepared: fine through a transaction pooler too."""
    try:
        with psycopg.connect(
            libpq_url(url),
            connect_timeout=max(1, round(timeout_s)),
            prepare_threshold=None,
            application_name=application_name,
        ) as conn:
            conn.execute("SELECT 1")
    except (OSError, psycopg.Error) as exc:
        lines = str(exc).strip().splitlines()
        return (lines[0] if lines else type(exc).__name__)[:200]
    return None
