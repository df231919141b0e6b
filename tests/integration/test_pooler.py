"""The engine behind PgBouncer 1.18 in transaction mode (Debian 12's, `make pgbouncer`): the
pooled DATABASE_URL carries every transaction, with no server-side prepared statement and
psycopg's pipelines going through it; what needs a session (the relay's LISTEN, migrations and
their advisory lock) uses DATABASE_DIRECT_URL."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import text
from temporalio.client import Client

from db import pipeline
from db.migrate import upgrade
from db.session import SessionMaker, make_engine, make_sessionmaker
from tests.pgbouncer import ensure_pgbouncer, pgbouncer
from tests.stack import JOB_QUEUES, engine_stack, make_settings

ECHO = text("SELECT CAST(:i AS integer) AS i")


@pytest.fixture(scope="module")
def pooled_url(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary, why = ensure_pgbouncer()
    if binary is None:
        pytest.skip(f"PgBouncer is not installed and could not be: {why}")
    # Fewer server connections than the engine's pools hold clients: transactions of different
    # clients share server sessions, as behind a production pooler.
    with pgbouncer(binary, database_url, tmp_path_factory.mktemp("pgbouncer"), pool_size=4) as url:
        yield url


async def test_no_statement_is_prepared_on_the_server_and_pipelines_work(
    db: SessionMaker, pooled_url: str
) -> None:
    engine = make_engine(pooled_url, pool_size=8, pooled=True)
    sm = make_sessionmaker(engine)
    try:

        async def one(i: int) -> None:
            # The same statement well past psycopg's default prepare threshold (5), from many
            # client connections sharing 4 server sessions.
            for _ in range(12):
                async with sm.begin() as s:
                    assert (await s.execute(text("SELECT :i"), {"i": i})).scalar_one() == i
                [rows] = await pipeline.run(sm, [(ECHO, {"i": i})], commit=False)
                assert rows == [{"i": i}]

        await asyncio.gather(*(one(i) for i in range(16)))
        async with engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            assert isinstance(raw, psycopg.AsyncConnection)
            assert raw.prepare_threshold is None
    finally:
        await engine.dispose()


def test_migrations_run_on_the_direct_url(database_url: str) -> None:
    # The advisory lock is a session's: it must not go through the pooler. Re-applying head is
    # a no-op that still takes and releases the lock.
    upgrade(database_url)


async def test_a_job_succeeds_through_the_pooler_with_the_relay_listening_directly(
    db: SessionMaker,
    pooled_url: str,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
) -> None:
    # A relay that only polled would take up to 10 s per job: the LISTEN on the direct URL
    # wakes it at each create's NOTIFY.
    settings = make_settings(
        pooled_url,
        temporal_address,
        DATABASE_DIRECT_URL=database_url,
        RELAY_POLL_INTERVAL_S=10,
    )
    assert settings.database_pooled and settings.session_database_url == database_url
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        await asyncio.sleep(0.5)  # the relay's LISTEN is up
        latencies = []
        for i in range(5):
            started = time.monotonic()
            job_id = await stack.create(target_id=f"t{i}", input={"echo": {"n": i}})
            row = await stack.wait_status(job_id, timeout=60)
            assert row.lifecycle_status == "succeeded", row
            async with stack.parts.sessionmaker() as s:
                lag = (
                    await s.execute(
                        text(
                            "SELECT extract(epoch FROM published_at - created_at) FROM outbox_event"
                            " WHERE aggregate_id = :id ORDER BY created_at LIMIT 1"
                        ),
                        {"id": str(job_id)},
                    )
                ).scalar()
            latencies.append(float(lag) if lag is not None else time.monotonic() - started)
        assert statistics.median(latencies) <= 2.0, latencies
