"""The embedded stack a benchmark run drives: servers, engine subprocesses, the engine database.

Hazards handled here:
- The engine's processes are `bench/procs.py` children: registered the moment they start and
  stopped by `stop_all()` whatever happens.
- `pg_stat_database.xact_commit` counts every committed transaction on the engine database,
  including the bench's own statements and read-only ones; `EngineDb` counts the bench's own so
  they can be subtracted. An idle backend publishes its counters only up to ~10 s late
  (PGSTAT_IDLE_INTERVAL), so readings are taken after `STATS_SETTLE_S` of quiet.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg

from bench.engine_cli import argv
from bench.procs import Proc, check_alive, child_env, stop_all, stop_group

# Re-exported: bench/isolation.py runs unchanged from older checkouts, whose bench/infra.py
# defines `progress`, so it imports it from here.
from bench.procs import progress as progress

DB_NAME = "aijobs_bench"
BENCH_JWT_SECRET = "bench-only-jwt-secret-not-for-production"
# Tables a repetition starts from empty (same list as the test suite's truncate).
TABLES = (
    "ai_job_artifact, ai_usage_log, ai_job_snapshot, outbox_event, user_model_credential, "
    "synthetic_result, quiz_question, flashcard, weak_point_candidate, ai_job"
)
# PGSTAT_IDLE_INTERVAL is 10 s: an idle backend that flushed less than 1 s before going idle
# publishes its remaining counts only then.
STATS_SETTLE_S = 11.5


# ---- servers ------------------------------------------------------------------------------


@dataclass
class Servers:
    base: Path
    pg: Any  # runtime.embedded.EmbeddedPostgres
    temporal: Any  # runtime.embedded.TemporalDevServer
    admin_uri: str  # libpq URI of the `postgres` database (reads stats without counting)
    database_url: str  # libpq URI of the engine's database
    log_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_dir = self.base / "logs"
        self.log_dir.mkdir(exist_ok=True)

    @property
    def socket_dir(self) -> str:
        return parse_qs(urlsplit(self.admin_uri).query)["host"][0]

    @property
    def temporal_address(self) -> str:
        return str(self.temporal.address)


@contextlib.contextmanager
def servers(*, keep: bool) -> Iterator[Servers]:
    """PostgreSQL (fresh data dir, default durability, max_connections raised for the pools of
    up to five processes) and a headless in-memory Temporal dev server; both stopped on exit."""
    from db.migrate import upgrade
    from runtime.embedded import free_port, start_postgres, start_temporal

    base = Path(tempfile.mkdtemp(prefix="aijobs-bench-"))
    base.chmod(0o755)  # the embedded server may run as its own system user
    pg = temporal = None
    try:
        progress(f"starting PostgreSQL in {base}")
        pg = start_postgres(base / "pg")
        with psycopg.connect(pg.uri, autocommit=True) as c:
            # Connections, not durability: synchronous_commit and fsync stay at their defaults.
            c.execute("ALTER SYSTEM SET max_connections = 300")
            c.execute(f"CREATE DATABASE {DB_NAME}")
        pg.stop()  # max_connections needs a restart
        pg = start_postgres(base / "pg")
        url = pg.uri.replace("/postgres?", f"/{DB_NAME}?")
        upgrade(url)
        progress("starting Temporal dev server (headless, in memory)")
        temporal = start_temporal(
            port=free_port(), ui_port=None, db_file=None, log_path=base / "temporal.log"
        )
        yield Servers(base=base, pg=pg, temporal=temporal, admin_uri=pg.uri, database_url=url)
    finally:
        stop_all()
        if temporal is not None:
            temporal.stop()
        if pg is not None:
            pg.stop()
        if keep:
            progress(f"kept {base} (logs in {base / 'logs'})")
        else:
            shutil.rmtree(base, ignore_errors=True)


# ---- the engine's database, from the bench's side ------------------------------------------


class EngineDb:
    """One autocommit connection to the engine's database. Every statement on it is a committed
    transaction that `pg_stat_database` charges to that database, so it keeps count (`commits`)
    for the commits-per-job figure to subtract."""

    def __init__(self, uri: str) -> None:
        self._uri = uri
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self.commits = 0

    async def open(self) -> None:
        self._conn = await psycopg.AsyncConnection.connect(self._uri, autocommit=True)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    async def fetchall(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        assert self._conn is not None
        self.commits += 1
        cur = await self._conn.execute(sql, params)
        return await cur.fetchall() if cur.description else []

    async def truncate(self) -> None:
        await self.fetchall(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE")

    async def status_counts(self) -> tuple[int, int]:
        """(succeeded, failed or cancelled) over all jobs."""
        rows = await self.fetchall(
            "SELECT count(*) FILTER (WHERE lifecycle_status = 'succeeded'), "
            "count(*) FILTER (WHERE lifecycle_status IN ('failed', 'cancelled')) FROM ai_job"
        )
        return int(rows[0][0]), int(rows[0][1])


class Admin:
    """A connection to the `postgres` database: cluster-wide views, uncounted for the engine's."""

    def __init__(self, uri: str) -> None:
        self._uri = uri
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def open(self) -> None:
        self._conn = await psycopg.AsyncConnection.connect(self._uri, autocommit=True)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    async def one(self, sql: str, params: Any = None) -> Any:
        assert self._conn is not None
        cur = await self._conn.execute(sql, params)
        row = await cur.fetchone()
        return row[0] if row else None

    async def xact_commit(self) -> int:
        return int(
            await self.one(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (DB_NAME,)
            )
        )

    async def listeners(self) -> int:
        """Relay LISTEN connections open on the engine's database."""
        return int(
            await self.one(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = %s AND query ILIKE 'LISTEN%%'",
                (DB_NAME,),
            )
        )

    async def wait_quiet(self, timeout_s: float = 30.0) -> None:
        """Until no session on the engine's database is inside a transaction or a statement.
        A load generator that stopped leaves requests the server still runs; a TRUNCATE then
        (ACCESS EXCLUSIVE on every table, one after another) and a create in flight (ai_job,
        then outbox_event) take the same locks in opposite orders and deadlock."""
        deadline = time.monotonic() + timeout_s
        while True:
            busy = int(
                await self.one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                    "AND backend_type = 'client backend' AND state <> 'idle'",
                    (DB_NAME,),
                )
            )
            if not busy:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{busy} session(s) still busy after {timeout_s:.0f}s")
            await asyncio.sleep(0.1)


# ---- engine processes ---------------------------------------------------------------------


@dataclass(frozen=True)
class EngineKnobs:
    """What every engine child gets, beyond the per-stack task queue suffix: settings, and
    tuning constants changed through bench/engine_cli.py (`module.NAME` or `relay.field`)."""

    interactive_concurrency: int
    log_level: str
    extra_env: dict[str, str]
    constants: dict[str, Any] = field(default_factory=dict)


def engine_env(sv: Servers, knobs: EngineKnobs, *, suffix: str, quotas: bool) -> dict[str, str]:
    base = {
        "DATABASE_URL": sv.database_url,
        "TEMPORAL_ADDRESS": sv.temporal_address,
        "TEMPORAL_NAMESPACE": "default",
        "AIJOBS_ENV": "development",  # the synthetic job type is public here
        "TASK_QUEUE_SUFFIX": suffix,
        "AI_INTERACTIVE_CONCURRENCY": str(knobs.interactive_concurrency),
        "LOG_LEVEL": knobs.log_level,
        "JWT_SECRET": BENCH_JWT_SECRET,
    }
    if not quotas:
        base["QUOTA_MAX_ACTIVE_JOBS"] = "0"
        base["QUOTA_MAX_JOBS_PER_DAY"] = "0"
    base.update(knobs.extra_env)
    return child_env(base)


class EngineStack:
    """`aijobs relay` plus `workers` x `aijobs worker --queue ai-interactive`, on task queues of
    their own (a fresh TASK_QUEUE_SUFFIX per stack)."""

    def __init__(self, name: str, sv: Servers, knobs: EngineKnobs, *, workers: int) -> None:
        self.name = name
        self.suffix = f"-bench{uuid.uuid4().hex[:8]}"
        self.queue = f"ai-interactive{self.suffix}"
        env = engine_env(sv, knobs, suffix=self.suffix, quotas=False)

        def aijobs(*command: str) -> list[str]:
            if not knobs.constants:
                return [sys.executable, "-m", "runtime.cli", *command]
            return [sys.executable, "-m", "bench.engine_cli", *argv(knobs.constants, command)]

        self.relay = Proc(f"{name}-relay", aijobs("relay"), env, sv.log_dir)
        self.workers = [
            Proc(
                f"{name}-worker{i + 1}",
                aijobs("worker", "--queue", "ai-interactive"),
                env,
                sv.log_dir,
            )
            for i in range(workers)
        ]
        self.procs = [self.relay, *self.workers]

    async def start(self, client: Any, admin: Admin, timeout_s: float = 90.0) -> None:
        before = await admin.listeners()
        for p in self.procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        await wait_pollers(client, self.queue, len(self.workers), deadline, self.procs)
        while await admin.listeners() <= before:
            self.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.relay.name} did not LISTEN in {timeout_s:.0f}s")
            await asyncio.sleep(0.1)
        progress(f"{self.name}: relay + {len(self.workers)} worker(s) ready on {self.queue}")

    def check(self) -> None:
        check_alive(self.procs)

    def stop(self) -> None:
        stop_group(self.procs)


async def wait_pollers(
    client: Any, queue: str, expected: int, deadline: float, procs: list[Proc]
) -> None:
    """Until `expected` distinct worker identities poll both the workflow and activity queue."""
    from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    async def pollers(kind: TaskQueueType.ValueType) -> int:
        resp = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
                task_queue_type=kind,
            )
        )
        return len({p.identity for p in resp.pollers})

    while True:
        check_alive(procs)
        wf = await pollers(TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)
        act = await pollers(TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
        if wf >= expected and act >= expected:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{expected} worker(s) not polling {queue} ({wf}/{act})")
        await asyncio.sleep(0.2)


def pgbench_path() -> Path:
    from runtime.embedded import pg_bin

    return pg_bin("pgbench")
