"""The dev stack's processes in PostgreSQL's eyes: the four processes `aijobs dev` starts (its
own argv, `runtime/devstack.py`), on a database of their own, after a synthetic job and with an
event stream open. Every backend names its process (`application_name`), all four are there,
and each holds exactly one LISTEN connection, `<process>-listener`; none other LISTENs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from api.auth import JwtConfig, issue_token
from db.migrate import upgrade
from db.session import libpq_url
from engine.settings import Settings
from runtime.devstack import Child, _children
from runtime.embedded import free_port
from runtime.worker import ALL_QUEUES
from tests.support import eventually

pytestmark = pytest.mark.slow

PROCESSES = ("aijobs-api", *(f"aijobs-worker-{q}" for q in ALL_QUEUES))
NAMES = {
    *PROCESSES,
    "aijobs-worker",
    "aijobs-relay",
    "aijobs-reconcile",
    "aijobs-migrate",
    "aijobs-cli",
}
ALLOWED = NAMES | {f"{n}-listener" for n in NAMES}


@pytest.fixture
def own_database(database_url: str) -> Iterator[str]:
    """A fresh database on the session's server, dropped afterwards: the stack's backends are
    the only ones there (the test process's own pools use the session's database)."""
    name = f"devstack_{uuid.uuid4().hex[:10]}"
    server = make_conninfo(libpq_url(database_url), dbname="postgres")
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    url = urlunsplit(urlsplit(libpq_url(database_url))._replace(path=f"/{name}"))
    try:
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.contextmanager
def dev_stack(url: str, temporal_address: str, logs: Path, api_port: int) -> Iterator[None]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "AIJOBS_ENV": "development",
        "LOG_LEVEL": "WARNING",
        "DATABASE_URL": url,
        "TEMPORAL_ADDRESS": temporal_address,
        "TASK_QUEUE_SUFFIX": f"-d{uuid.uuid4().hex[:8]}",
        "WORKER_DRAIN_S": "0",
    }
    ports = {q: (free_port(), free_port()) for q in ALL_QUEUES}
    children: list[Child] = _children(argparse.Namespace(api_port=api_port), env, ports, logs)
    try:
        for c in children:
            c.start()
        yield
    finally:
        for c in children:
            c.terminate()
        for c in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.stop(20)


async def sample(url: str, seconds: float) -> list[tuple[str, int, str]]:
    """(application_name, pid, last statement) of every client backend of the stack's database
    (this connection aside, backends still starting skipped), every 0.2 s for `seconds`."""
    seen: list[tuple[str, int, str]] = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            cur = await conn.execute(
                "SELECT coalesce(application_name, ''), pid, coalesce(query, '') "
                "FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid() "
                "AND state IS DISTINCT FROM 'starting'"
            )
            seen += [(str(r[0]), int(r[1]), str(r[2])) for r in await cur.fetchall()]
            await asyncio.sleep(0.2)
    return seen


@contextlib.asynccontextmanager
async def stream_open(base: str, token: str) -> AsyncIterator[None]:
    """The all-jobs event stream, held open (its first bytes read) until the block ends."""
    opened = asyncio.Event()

    async def read() -> None:
        async with httpx.AsyncClient(base_url=base, timeout=None) as http:
            headers = {"Authorization": f"Bearer {token}"}
            async with http.stream("GET", "/api/ai/jobs/events", headers=headers) as r:
                assert r.status_code == 200
                opened.set()
                async for _ in r.aiter_bytes():
                    pass

    task = asyncio.create_task(read())
    try:
        await asyncio.wait_for(opened.wait(), 30)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


async def test_every_connection_names_its_process_and_each_listens_once(
    own_database: str, temporal_address: str, tmp_path: Path
) -> None:
    upgrade(own_database, application_name="aijobs-migrate")  # as `aijobs dev` does
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    dev = Settings.model_validate({"AIJOBS_ENV": "development"})
    token = issue_token(JwtConfig.from_settings(dev), "u-names")
    with dev_stack(own_database, temporal_address, tmp_path, port):
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:

            async def up() -> bool:
                with contextlib.suppress(httpx.HTTPError):
                    return (await http.get("/readyz")).status_code == 200
                return False

            await eventually(up, timeout=90, interval=0.3, what="the stack's API ready")

            async def listeners() -> bool:
                names = {
                    n for n, _, q in await sample(own_database, 0.01) if q.startswith("LISTEN")
                }
                return names >= {f"{p}-listener" for p in PROCESSES[1:]}

            await eventually(listeners, timeout=90, interval=0.5, what="the workers listening")
            async with stream_open(base, token):
                created = await http.post(
                    "/api/ai/jobs",
                    json={"jobType": "synthetic", "targetType": "t", "targetId": "1", "input": {}},
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert created.status_code in (200, 202), created.text
                job = created.json()["jobId"]

                async def succeeded() -> bool:
                    r = await http.get(
                        f"/api/ai/jobs/{job}", headers={"Authorization": f"Bearer {token}"}
                    )
                    return bool(r.json()["lifecycleStatus"] == "succeeded")

                await eventually(succeeded, timeout=60, interval=0.3, what="the job to succeed")
                seen = await sample(own_database, 3.0)

    names = {n for n, _, _ in seen}
    assert names <= ALLOWED, names - ALLOWED
    assert names >= set(PROCESSES), set(PROCESSES) - names
    listening = {(n, pid) for n, pid, q in seen if q.lstrip().upper().startswith("LISTEN")}
    assert all(n.endswith("-listener") for n, _ in listening), listening
    per_process = Counter(n for n, _ in listening)
    assert per_process == Counter({f"{p}-listener": 1 for p in PROCESSES}), per_process
    # Every `-listener` connection seen, whatever its last statement, is its process's one.
    listener_pids = Counter(
        n for n, _ in {(n, pid) for n, pid, _ in seen} if n.endswith("-listener")
    )
    assert all(count == 1 for count in listener_pids.values()), listener_pids
