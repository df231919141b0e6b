"""Several processes of each role against one PostgreSQL (behind PgBouncer in transaction mode)
and one persistent Temporal server, under load from several users: one process of each role is
killed with SIGKILL and restarted, the Temporal server is killed and restarted on its database
file, then every worker is restarted one by one (a rolling deploy). Every job ends exactly once,
with at most one charged call per attempt, no job stuck, no outbox row left claimed, no process
left running."""

from __future__ import annotations

import itertools
import random
import time
import uuid

import httpx
import psycopg
import pytest

from api.auth import JwtConfig, issue_token
from db.session import libpq_url
from engine.settings import DEV_JWT_SECRET
from tests.cluster.harness import Cluster, cluster
from tests.pgbouncer import ensure_pgbouncer

pytestmark = pytest.mark.slow
USERS = ("alice", "bob", "carol")
TERMINAL = ("succeeded", "failed", "cancelled")


class Load:
    """Creates synthetic jobs round-robin over users and API processes; a create that meets a
    dead API is sent again to another one with the same Idempotency-Key (one job either way)."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.http = httpx.Client(timeout=10)
        config = JwtConfig(DEV_JWT_SECRET)
        self.tokens = {u: issue_token(config, u, ttl_s=3600) for u in USERS}
        self.users = itertools.cycle(USERS)
        self.apis = itertools.cycle(range(len(c.api_urls())))
        self.keys: list[str] = []

    def create(self, n: int) -> None:
        for _ in range(n):
            user, key = next(self.users), uuid.uuid4().hex
            body = {
                "jobType": "synthetic",
                "targetType": "lesson",
                "targetId": f"l-{key[:8]}",
                "input": {"delayMs": random.randint(200, 1500)},
            }
            headers = {"Authorization": f"Bearer {self.tokens[user]}", "Idempotency-Key": key}
            for attempt in range(20):
                url = self.c.api_urls()[next(self.apis)]
                try:
                    r = self.http.post(f"{url}/api/ai/jobs", json=body, headers=headers)
                except httpx.HTTPError:
                    continue
                if r.status_code in (200, 201, 202):
                    self.keys.append(key)
                    break
                assert r.status_code >= 500 or r.status_code == 429, r.text
                time.sleep(0.2 * (attempt + 1))
            else:
                raise AssertionError("a create never succeeded")


def _rows(url: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(libpq_url(url)) as conn:
        return list(conn.execute(sql).fetchall())


def _wait_outbox_drained(c: Cluster, timeout_s: float) -> None:
    """The relay publishes a job's ending event after the job has ended, and a relay activity
    whose process was killed resumes on another worker within its heartbeat timeout: the last
    events may still be pending when the last job ends. Waits (bounded) until none is; what is
    left after the deadline is reported by `checks`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = _rows(
            c.direct_url,
            "SELECT count(*) FROM outbox_event WHERE status IN ('pending','processing')",
        )
        if left == [(0,)]:
            return
        time.sleep(1)


def _wait_all_terminal(c: Cluster, expected: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        [(total, done)] = _rows(
            c.direct_url,
            "SELECT count(*), count(*) FILTER (WHERE lifecycle_status IN "
            "('succeeded','failed','cancelled')) FROM ai_job",
        )
        if total == expected and done == expected:
            return
        for p in c.all():
            assert p.running, f"{p.name} exited: {p.log.read_text()[-2000:]}"
        time.sleep(1)
    stuck = _rows(
        c.direct_url,
        "SELECT lifecycle_status, count(*) FROM ai_job GROUP BY lifecycle_status",
    )
    raise AssertionError(f"jobs not all terminal after {timeout_s} s: {stuck}")


def test_the_cluster_survives_kill_9_of_each_role_and_of_temporal_under_load() -> None:
    binary, why = ensure_pgbouncer()
    if binary is None:
        pytest.skip(f"PgBouncer is not installed and could not be: {why}")
    started = time.monotonic()

    def phase(name: str) -> None:
        print(f"cluster test: {name} at {time.monotonic() - started:.0f} s", flush=True)

    with cluster(binary) as c:
        c.start_processes()
        c.wait_ready()
        phase("ready")
        load = Load(c)
        load.create(12)
        # One process of each role dies mid-load; the others carry on; each is restarted.
        for role in ("interactive", "api", "system", "background"):
            victim = c.processes[role][0]
            victim.kill9()
            load.create(4)
            victim.start()
        c.wait_ready()
        phase("each role killed and restarted")
        load.create(6)
        # The Temporal server dies and comes back on the same database file.
        c.kill_temporal()
        time.sleep(1)
        c.start_temporal()
        load.create(6)
        phase("temporal restarted")
        # A rolling deploy: every worker stopped (SIGTERM: it drains) and started, one by one.
        for role in ("interactive", "background", "system"):
            for p in c.processes[role]:
                p.stop()
                p.start()
                load.create(2)
        phase("rolling deploy")
        _wait_all_terminal(c, len(load.keys), timeout_s=150)
        phase("all terminal")
        _wait_outbox_drained(c, timeout_s=60)
        phase("outbox drained")
        checks(c, len(load.keys))
        procs = [p.proc for p in c.all() if p.proc is not None]
    assert all(p.poll() is not None for p in procs), "a process was left running"
    print(f"cluster test: {len(load.keys)} jobs, {time.monotonic() - started:.0f} s")


def checks(c: Cluster, expected: int) -> None:
    rows = _rows(c.direct_url, "SELECT lifecycle_status, count(*) FROM ai_job GROUP BY 1")
    statuses = {str(status): n for status, n in rows}
    assert statuses == {"succeeded": expected}, statuses
    # Projected once per job; at most one charged call per attempt.
    assert _rows(
        c.direct_url,
        "SELECT count(*), count(DISTINCT job_id) FROM synthetic_result",
    ) == [(expected, expected)]
    double = _rows(
        c.direct_url,
        "SELECT job_id, attempt_no, count(*) FROM ai_usage_log "
        "WHERE chunk_no IS NULL GROUP BY 1, 2 HAVING count(*) > 1",
    )
    assert double == [], double
    # Every domain event once per job, none left claimed or pending.
    dup_events = _rows(
        c.direct_url,
        "SELECT aggregate_id, event_type, count(*) FROM outbox_event "
        "GROUP BY 1, 2 HAVING count(*) > 1",
    )
    assert dup_events == [], dup_events
    left = _rows(
        c.direct_url,
        "SELECT status, count(*) FROM outbox_event WHERE status IN ('pending','processing') "
        "GROUP BY 1",
    )
    assert left == [], left
