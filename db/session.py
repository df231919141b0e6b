"""Engines and session factories. Transactions open at the boundary (one per API write, one per
activity attempt) with `async with sessionmaker.begin()`; repositories never commit."""

from __future__ import annotations

import psycopg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

SessionMaker = async_sessionmaker[AsyncSession]


def sqlalchemy_url(url: str) -> str:
    """Accept libpq-style URLs (`postgresql://...`) and use psycopg 3 for them."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def libpq_url(url: str) -> str:
    """The same URL for plain psycopg / libpq tools (LISTEN connections, pgbench)."""
    for prefix in ("postgresql+psycopg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


def make_engine(url: str, *, pool_size: int = 10, max_overflow: int = 20) -> AsyncEngine:
    return create_async_engine(
        sqlalchemy_url(url),
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


async def listen_connection(database_url: str, channel: str) -> psycopg.AsyncConnection[object]:
    """An autocommit connection that LISTENs on `channel` (one of our constant channel names).
    Notifications are hints that something changed; the caller closes the connection."""
    conn: psycopg.AsyncConnection[object] = await psycopg.AsyncConnection.connect(
        libpq_url(database_url), autocommit=True
    )
    try:
        await conn.execute(f"LISTEN {channel}")
    except BaseException:
        await conn.close()
        raise
    return conn


async def ping_connection(conn: psycopg.AsyncConnection[object]) -> None:
    """One round trip on a LISTEN connection: an idle connection that died says so here."""
    await conn.execute("SELECT 1")
