"""The engine as a cluster, from the project's own files: a PostgreSQL server and a Temporal
dev server with a database file (`temporal server start-dev --db-filename`) started separately,
PgBouncer in transaction mode in front of PostgreSQL, and every engine process started with the
`aijobs` CLI (2 API, 2 ai-interactive, 1 ai-background, 2 ai-system), each killable and
restartable on its own."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench import engine_cli
from runtime.embedded import (
    EmbeddedPostgres,
    TemporalDevServer,
    free_port,
    start_postgres,
    start_temporal,
)
from tests.pgbouncer import pgbouncer

ROOT = Path(__file__).resolve().parents[2]
# Processes get killed here: a job's SQL lock (engine/queues.py) and a relay's outbox claim
# (activities/relay.py) lapse in seconds, not the minute that suits a deployment.
SHORT_LOCKS = {"engine.queues.LOCK_TTL_S": 3, "relay.lock_ttl_s": 5.0}


def engine_argv(command: list[str]) -> list[str]:
    """`aijobs <command>` with the short locks (bench/engine_cli.py)."""
    return engine_cli.argv(SHORT_LOCKS, command)


# (role, command after `aijobs`, how many)
TOPOLOGY: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("api", ("api", "--host", "127.0.0.1"), 2),
    ("interactive", ("worker", "--queue", "ai-interactive"), 2),
    ("background", ("worker", "--queue", "ai-background"), 1),
    ("system", ("worker", "--queue", "ai-system"), 2),
)


@dataclass
class Process:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    port: int | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [*self.argv, "--port", str(self.port)] if self.port else self.argv
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench.engine_cli", *engine_argv(argv)],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill9(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, f"{self.name} is not running"
        self.proc.kill()
        self.proc.wait(10)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Cluster:
    base: Path
    pgbouncer_binary: str
    direct_url: str = ""
    pooled_url: str = ""
    temporal_port: int = field(default_factory=free_port)
    pg: EmbeddedPostgres | None = None
    temporal: TemporalDevServer | None = None
    processes: dict[str, list[Process]] = field(default_factory=dict)

    def start_temporal(self) -> None:
        """On the same port and database file each time: a restart keeps every workflow."""
        self.temporal = start_temporal(
            port=self.temporal_port, ui_port=None, db_file=self.base / "temporal.db"
        )

    def kill_temporal(self) -> None:
        assert self.temporal is not None
        self.temporal.process.kill()
        self.temporal.process.wait(10)
        self.temporal = None

    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/tmp"),
            "AIJOBS_ENV": "test",
            "LOG_LEVEL": "WARNING",
            "DATABASE_URL": self.pooled_url,
            "DATABASE_DIRECT_URL": self.direct_url,
            "TEMPORAL_ADDRESS": f"127.0.0.1:{self.temporal_port}",
            "WORKER_METRICS_PORT": "0",
            "TEMPORAL_METRICS_PORT": "0",
            "RELAY_POLL_INTERVAL_S": "1",
            "QUOTA_MAX_ACTIVE_JOBS": "0",
            "QUOTA_MAX_JOBS_PER_DAY": "0",
            # A killed worker's attempt is retried elsewhere within seconds, not half a minute.
            "AI_HEARTBEAT_TIMEOUT_MS": "3000",
            "RECONCILE_INTERVAL_S": "5",
            "WORKER_DRAIN_S": "5",
        }

    def migrate(self) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "runtime.cli", "migrate"],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-2000:]

    def start_processes(self) -> None:
        env = self.env()
        for role, argv, n in TOPOLOGY:
            self.processes[role] = [
                Process(
                    f"{role}-{i}",
                    list(argv),
                    env,
                    self.base / f"{role}-{i}.log",
                    port=free_port() if role == "api" else None,
                )
                for i in range(n)
            ]
        for p in self.all():
            p.start()

    def all(self) -> list[Process]:
        return [p for ps in self.processes.values() for p in ps]

    def api_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p.port}" for p in self.processes["api"]]

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        pending = set(self.api_urls())
        while pending and time.monotonic() < deadline:
            for p in self.all():
                assert p.running, f"{p.name} exited: {p.log.read_text()[-2000:]}"
            for url in list(pending):
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                        pending.discard(url)
            time.sleep(0.5)
        assert not pending, f"APIs not ready: {pending}"

    def stop(self) -> None:
        for p in self.all():
            if p.running and p.proc is not None:
                p.proc.send_signal(signal.SIGTERM)
        for p in self.all():
            p.stop()


@contextlib.contextmanager
def cluster(pgbouncer_binary: str) -> Iterator[Cluster]:
    base = Path(tempfile.mkdtemp(prefix="aijobs-cluster-"))
    base.chmod(0o755)
    c = Cluster(base, pgbouncer_binary)
    try:
        c.pg = start_postgres(base / "pg")
        c.direct_url = c.pg.uri
        c.start_temporal()
        with pgbouncer(pgbouncer_binary, c.direct_url, base / "pgbouncer", pool_size=20) as url:
            c.pooled_url = url
            c.migrate()
            try:
                yield c
            finally:
                c.stop()
    finally:
        with contextlib.suppress(Exception):
            if c.temporal is not None:
                c.temporal.stop()
        with contextlib.suppress(Exception):
            if c.pg is not None:
                c.pg.stop()
        shutil.rmtree(base, ignore_errors=True)
