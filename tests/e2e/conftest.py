"""E2E fixtures: the real FastAPI app under uvicorn on 127.0.0.1, on the session's PostgreSQL and
Temporal dev server, reached over HTTP with httpx.

- `api`: a shared server (test settings, no quotas, no workers) plus a clean database per test.
  Jobs stay `queued` unless the test also asks for `workers`.
- `workers`: in-process workers for `ai-interactive` plus the outbox relay
  (`tests.stack.engine_stack`) on a task queue of the test's own, so jobs really run.
- `start_api(settings, ...)`: a dedicated server for tests that need other settings (quotas,
  production, an unreachable Temporal).

The server runs as a task on the session event loop; tests talk to it through a real socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from playwright.async_api import Browser
from temporalio.client import Client

import jobs.bulk
from api.auth import JwtConfig, issue_token
from api.routes import admin_bulk
from db.session import SessionMaker
from engine.settings import Settings
from jobs.service import CreatePolicy
from jobs.spec import Catalog
from runtime.wiring import api_app
from tests.e2e.console_helpers import chromium
from tests.stack import TERMINAL, Stack, engine_stack, make_settings
from tests.support import eventually

PROBLEM = "application/problem+json"
JOB_STATUS_KEYS = {
    "jobId",
    "jobType",
    "lifecycleStatus",
    "queueName",
    "priority",
    "progress",
    "createdAt",
    "startedAt",
    "finishedAt",
    "errorCode",
    "publicErrorMessage",
    "result",
    "targetType",
    "targetId",
    "metadata",
    "runAt",
    "promptVersion",
    "outputSchemaVersion",
    "privateDataPurged",
    "serviceTier",
    "reusedFromJobId",
    "tags",
    "rolloutArm",
}
# What an error body must never carry: traces, SQL, drivers, hosts, paths.
LEAK_MARKERS = (
    "Traceback",
    'File "',
    "sqlalchemy",
    "psycopg",
    "SELECT ",
    "INSERT ",
    "UPDATE ai_job",
    "127.0.0.1",
    "localhost",
    "/work/",
    "site-packages",
    "postgresql://",
)


# ---- the server --------------------------------------------------------------------------


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: Ctrl-C must still stop pytest, not just the app."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serve(app: FastAPI, *, port: int = 0, start_timeout: float = 20.0) -> AsyncIterator[str]:
    """Runs `app` (lifespan on) on 127.0.0.1 (`port` 0: any free one) and yields its base URL.

    The listening socket is bound here and handed to uvicorn: no window in which
    another process (a concurrent test run) could take a "free" port between probe and bind."""
    # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets whose proto
    # says TCP; with proto 0, Nagle + delayed ACKs add ~40 ms to every response.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        access_log=False,
        http="h11",  # as `aijobs api` serves (runtime/cli.py)
    )
    server = _Server(config)

    async def run() -> None:
        try:
            await server.serve(sockets=[sock])
        except SystemExit as exc:  # uvicorn exits on a failed start-up; keep pytest alive
            raise RuntimeError(f"uvicorn failed to start (exit {exc.code})") from None

    task = asyncio.create_task(run(), name=f"uvicorn:{port}")

    async def started() -> bool:
        if task.done():
            task.result()  # raises the start-up failure
            raise RuntimeError("uvicorn stopped before it started")
        return bool(server.started)

    try:
        await eventually(started, timeout=start_timeout, interval=0.01, what="uvicorn to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(task), 15)
        except TimeoutError:
            server.force_exit = True
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        sock.close()


# ---- tokens ------------------------------------------------------------------------------


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Api:
    """A running app: its settings, its base URL and an httpx client pointed at it."""

    settings: Settings
    base_url: str
    http: httpx.AsyncClient
    app: FastAPI

    def token(self, user_id: str, *, admin: bool = False, ttl_s: int = 3600) -> str:
        return issue_token(
            JwtConfig.from_settings(self.settings), user_id, admin=admin, ttl_s=ttl_s
        )

    def as_user(self, user_id: str = "alice") -> dict[str, str]:
        return bearer(self.token(user_id))

    def as_admin(self, user_id: str = "root") -> dict[str, str]:
        return bearer(self.token(user_id, admin=True))

    def expired(self, user_id: str = "alice") -> dict[str, str]:
        return bearer(self.token(user_id, ttl_s=-60))

    def forged(self, user_id: str = "alice") -> dict[str, str]:
        """Well-formed, unexpired, admin claims, but signed with another secret."""
        return bearer(issue_token("not-the-server-secret-" + "x" * 16, user_id, admin=True))

    # ---- calls used by many tests ----

    async def create(
        self,
        user: str = "alice",
        *,
        input: dict[str, Any] | None = None,
        key: str | None = None,
        expect: int | None = 202,
        **body: Any,
    ) -> httpx.Response:
        payload: dict[str, Any] = {
            "jobType": "synthetic",
            "targetType": "lesson",
            "targetId": "lesson-1",
            "input": input if input is not None else {},
        }
        payload.update(body)
        headers = self.as_user(user)
        if key is not None:
            headers["Idempotency-Key"] = key
        r = await self.http.post("/api/ai/jobs", json=payload, headers=headers)
        if expect is not None:
            assert r.status_code == expect, r.text
        return r

    async def create_id(self, user: str = "alice", **kw: Any) -> str:
        return str((await self.create(user, **kw)).json()["jobId"])

    async def get(self, job_id: str, user: str = "alice") -> dict[str, Any]:
        r = await self.http.get(f"/api/ai/jobs/{job_id}", headers=self.as_user(user))
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    async def admin_get(self, job_id: str) -> dict[str, Any]:
        r = await self.http.get(f"/admin-api/ai/jobs/{job_id}", headers=self.as_admin())
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    async def cancel(self, job_id: str, user: str = "alice") -> httpx.Response:
        return await self.http.post(f"/api/ai/jobs/{job_id}/cancel", headers=self.as_user(user))

    async def wait_status(
        self, job_id: str, *statuses: str, user: str = "alice", timeout: float = 30.0
    ) -> dict[str, Any]:
        """Polls the public GET (what a client would do) until the job is in one of `statuses`."""
        wanted = set(statuses or TERMINAL)
        last: dict[str, Any] = {}

        async def reached() -> dict[str, Any] | None:
            nonlocal last
            last = await self.get(job_id, user)
            return last if last["lifecycleStatus"] in wanted else None

        return await eventually(
            reached, timeout=timeout, what=lambda: f"job {job_id} to reach {wanted} (last {last})"
        )


def assert_problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """An RFC 9457 problem with our `code`, and nothing a client must not see."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].split(";")[0] == PROBLEM, r.headers["content-type"]
    body: dict[str, Any] = r.json()
    assert body["code"] == code, body
    assert body["status"] == status, body
    for member in ("type", "title", "detail"):
        assert isinstance(body[member], str) and body[member], (member, body)
    assert_no_leak(r.text)
    return body


def assert_no_leak(text: str) -> None:
    for marker in LEAK_MARKERS:
        assert marker not in text, f"{marker!r} leaked in {text[:500]}"


@contextlib.asynccontextmanager
async def start_api(
    settings: Settings,
    *,
    policy: CreatePolicy | None = None,
    catalog: Catalog | None = None,
    temporal: Client | None = None,
) -> AsyncIterator[Api]:
    app = api_app(settings, policy=policy, catalog=catalog, temporal=temporal)
    async with serve(app) as base_url, httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        yield Api(settings, base_url, http, app)


def fast_bulk(monkeypatch: pytest.MonkeyPatch, start_after_s: float = 3600) -> None:
    """Bulk operations at a test's pace (jobs/bulk.py); by default the API never starts a
    workflow the relay was meant to start (api/routes/admin_bulk.py)."""
    monkeypatch.setattr(jobs.bulk, "JOBS_PER_SECOND", 2000)
    monkeypatch.setattr(admin_bulk, "START_AFTER_S", start_after_s)


# ---- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
async def shared_api(database_url: str, temporal_address: str) -> AsyncIterator[Api]:
    """One server for the tests that need default settings (starting one costs a few 100 ms)."""
    async with start_api(make_settings(database_url, temporal_address)) as api:
        yield api


@pytest.fixture
async def api(db: SessionMaker, shared_api: Api) -> Api:
    """The shared server over a truncated database."""
    return shared_api


@pytest.fixture
def env(database_url: str, temporal_address: str) -> Any:
    """`env(**ENV)` → Settings for a dedicated server (see `start_api`)."""

    def build(**overrides: Any) -> Settings:
        return make_settings(database_url, temporal_address, **overrides)

    return build


@pytest.fixture
async def workers(db: SessionMaker, env: Any, temporal_client: Client) -> AsyncIterator[Stack]:
    """Workers for `ai-interactive` and the relay, on task queues of this test's own: jobs
    created through any server of this test really run."""
    async with engine_stack(env(), temporal_client) as stack:
        yield stack


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    """One headless chromium for the session's browser tests (tests/e2e/console_helpers.py)."""
    async with chromium() as b:
        yield b
