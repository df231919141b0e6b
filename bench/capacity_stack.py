"""The stack `python -m bench.capacity` measures, and its readings: one process per engine role,
each started with the `aijobs` CLI (`python -m runtime.cli`, the console script's module) on the
embedded PostgreSQL and Temporal dev server of `bench.infra.servers`, jobs created over HTTP by
several users, and the counters read around a run.

Hazards handled here:
- Every child is a `bench.procs.Proc`: registered when it starts, stopped by `stop_all()`.
- The bench's own statements on the engine's database (the polls for the jobs' ends) are
  counted by `EngineDb` and subtracted from the transactions per job.
- WAL is cluster-wide; nothing else writes to this cluster while a run is measured (the
  `postgres` database is only read), and the idle rate is subtracted like the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from bench.capacity_model import HistoryCount, count_history, parse_prometheus
from bench.infra import (
    BENCH_JWT_SECRET,
    DB_NAME,
    Admin,
    EngineDb,
    EngineKnobs,
    Servers,
    engine_env,
    wait_pollers,
)
from bench.loadgen import Request
from bench.procs import Proc, check_alive, process_cpu_s, progress, stop_group, tree_cpu_s
from bench.throughput import CpuMeter

# (role, the `aijobs` arguments, the task queue it polls or None)
ROLE_COMMANDS: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    ("interactive", ("worker", "--queue", "ai-interactive"), "ai-interactive"),
    ("background", ("worker", "--queue", "ai-background"), "ai-background"),
    ("system", ("worker", "--queue", "ai-system"), "ai-system"),
    ("api", ("api", "--host", "127.0.0.1"), None),
)
BACKGROUND_TYPE = "weak_point_analysis"
# A learner's answers for the background job type (its synthetic provider derives the output).
ANSWERS = [
    {
        "question": "Where does photosynthesis take place?",
        "givenAnswer": "mitochondria",
        "correctAnswer": "chloroplasts",
        "isCorrect": False,
        "topic": "cell biology",
    },
    {
        "question": "Which gas does photosynthesis release?",
        "givenAnswer": "oxygen",
        "correctAnswer": "oxygen",
        "isCorrect": True,
        "topic": "photosynthesis",
    },
]


def utc_now() -> datetime:
    """Naive UTC, the form `count_history` compares event times in."""
    return datetime.now(UTC).replace(tzinfo=None)


@dataclass
class Stack:
    """One process per engine role on task queues of their own (a fresh TASK_QUEUE_SUFFIX)."""

    sv: Servers
    procs: dict[str, Proc] = field(default_factory=dict)
    suffix: str = field(default_factory=lambda: f"-cap{uuid.uuid4().hex[:8]}")
    port: int = 0

    def start(self, knobs: EngineKnobs) -> None:
        from runtime.embedded import free_port

        env = engine_env(self.sv, knobs, suffix=self.suffix, quotas=False)
        self.port = free_port()
        for role, argv, _ in ROLE_COMMANDS:
            extra = ("--port", str(self.port)) if role == "api" else ()
            cmd = [sys.executable, "-m", "runtime.cli", *argv, *extra]
            self.procs[role] = Proc(f"capacity-{role}", cmd, env, self.sv.log_dir)
            self.procs[role].start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def ready(self, client: Any, admin: Admin, timeout_s: float = 120.0) -> None:
        """Every worker polls its queue, the API answers /readyz, the relay LISTENs."""
        deadline = time.monotonic() + timeout_s
        procs = list(self.procs.values())
        for _, _, queue in ROLE_COMMANDS:
            if queue is not None:
                await wait_pollers(client, f"{queue}{self.suffix}", 1, deadline, procs)
        async with httpx.AsyncClient() as c:
            while True:
                check_alive(procs)
                with contextlib.suppress(httpx.HTTPError):
                    if (await c.get(f"{self.base_url}/readyz", timeout=2)).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError("the API did not become ready")
                await asyncio.sleep(0.2)
        while await admin.listeners() < 1:
            check_alive(procs)
            if time.monotonic() > deadline:
                raise TimeoutError("the relay did not LISTEN")
            await asyncio.sleep(0.2)
        progress(f"capacity: {', '.join(self.procs)} ready on *{self.suffix}")

    def check(self) -> None:
        check_alive(list(self.procs.values()))

    def stop(self) -> None:
        stop_group(list(self.procs.values()))

    def cpu_meter(self) -> CpuMeter:
        """CPU seconds per role: each engine process, the PostgreSQL tree, the Temporal server,
        and the bench itself (the HTTP load and the polls), for reference."""

        def own() -> float:
            r = resource.getrusage(resource.RUSAGE_SELF)
            return r.ru_utime + r.ru_stime

        def cpu_of(p: Proc) -> Callable[[], float]:
            return lambda: process_cpu_s(p.pid)

        meter: CpuMeter = {role: cpu_of(p) for role, p in self.procs.items()}
        meter["postgres"] = lambda: tree_cpu_s(self.sv.pg.pid)
        meter["temporal"] = lambda: process_cpu_s(self.sv.temporal.process.pid)
        meter["bench_client"] = own
        return meter


# ---- the load ------------------------------------------------------------------------------


def job_requests(n: int, users: int, background_share: float, tag: str) -> list[Request]:
    """N POST /api/ai/jobs requests, round-robin over `users` tokens; every k-th one (k from
    `background_share`) a background job type, the rest synthetic."""
    from api.auth import issue_token

    tokens = [issue_token(BENCH_JWT_SECRET, f"capacity-user-{u}") for u in range(users)]
    every = round(1 / background_share) if background_share > 0 else 0
    out = []
    for i in range(n):
        background = every > 0 and i % every == every - 1
        body = {
            "jobType": BACKGROUND_TYPE if background else "synthetic",
            "targetType": "bench",
            "targetId": f"{tag}-{i}",
            "input": {"answers": ANSWERS} if background else {},
        }
        headers = {
            "Authorization": f"Bearer {tokens[i % users]}",
            "Content-Type": "application/json",
        }
        out.append(Request("POST", "/api/ai/jobs", headers, json.dumps(body).encode()))
    return out


async def send_all(base_url: str, requests: list[Request], concurrency: int) -> Counter[int]:
    """Send every request over `concurrency` keep-alive connections; the status codes."""
    codes: Counter[int] = Counter()
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60.0) as c:

        async def one(r: Request) -> None:
            async with sem:
                resp = await c.request(r.method, r.url, headers=r.headers, content=r.content)
                codes[resp.status_code] += 1

        await asyncio.gather(*(one(r) for r in requests))
    return codes


async def wait_ended(edb: EngineDb, stack: Stack, n: int, timeout_s: float) -> tuple[int, int]:
    """Until `n` jobs have ended (polled every 0.25 s); (succeeded, failed or cancelled)."""
    deadline = time.monotonic() + timeout_s
    while True:
        ok, bad = await edb.status_counts()
        if ok + bad >= n:
            return ok, bad
        stack.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{ok + bad}/{n} jobs ended in {timeout_s:.0f}s")
        await asyncio.sleep(0.25)


# ---- counters ------------------------------------------------------------------------------


async def pg_counters(admin: Admin) -> dict[str, int]:
    """The transactions the engine's sessions end (COMMIT and ROLLBACK statements, from
    pg_stat_statements: what figure 5 counts the commits of), every transaction of the engine's
    database as `pg_stat_database` counts it (with the listening backends' reads of the NOTIFY
    queue and autovacuum's, flushed late), and the WAL position in bytes."""
    all_xacts = await admin.one(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (DB_NAME,)
    )
    commits, rollbacks = await admin.engine_xacts()
    wal = await admin.one("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
    return {
        "transactions": commits + rollbacks,
        "rollbacks": rollbacks,
        "all_transactions": int(all_xacts),
        "wal_bytes": int(wal),
    }


async def temporal_actions(sv: Servers) -> dict[str, float]:
    """The dev server's `action` counter per `action_type` label (empty when not exposed)."""
    port = sv.temporal.extra.get("metrics_port")
    if not port:
        return {}
    async with httpx.AsyncClient() as c:
        text = (await c.get(f"http://127.0.0.1:{port}/metrics", timeout=10)).text
    out: dict[str, float] = {}
    for labels, value in parse_prometheus(text, "action"):
        key = labels.get("action_type") or labels.get("operation") or "?"
        out[key] = out.get(key, 0.0) + value
    return out


async def job_histories(client: Any, workflow_ids: list[str]) -> HistoryCount:
    """Events and actions of the given job workflows' histories (every run of each)."""
    total = HistoryCount()
    sem = asyncio.Semaphore(8)

    async def one(wid: str) -> None:
        async with sem:
            history = await client.get_workflow_handle(wid).fetch_history()
        total.add(count_history(history.events))

    await asyncio.gather(*(one(w) for w in workflow_ids))
    return total


async def system_histories(
    client: Any, skip_prefixes: tuple[str, ...], since: datetime, until: datetime
) -> tuple[HistoryCount, list[str]]:
    """Events and actions, within [since, until), of every other workflow run in the namespace
    (the relay shards, the reconciler's runs); and their workflow ids."""
    total, ids = HistoryCount(), []
    async for wf in client.list_workflows():
        if wf.id.startswith(skip_prefixes):
            continue
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        part = count_history(history.events, since=since, until=until)
        if part.events:
            total.add(part)
            ids.append(wf.id)
    return total, sorted(set(ids))
