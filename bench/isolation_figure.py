"""The tenant-isolation figure's scenario (`python -m bench.isolation` runs it): the engine in
this process against the fake provider, user B's job timed alone, during user A's burst of
rejected requests and just after it; and its table.

Like `bench/isolation.py`, it imports only what older checkouts of the engine also have, so both
files can be copied into such a tree and run there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import statistics
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.isolation import (
    A_JOBS,
    FLASH,
    JWT_SECRET,
    MODEL,
    PLATFORM_KEY,
    POISON,
    POLL_S,
    RULE_TOO_LONG,
    SOURCE,
    USER_A,
    USER_B,
    FakeLLM,
)


@dataclass
class Figures:
    tree: str
    reps: int
    alone_s: list[float] = field(default_factory=list)
    during_s: list[float] = field(default_factory=list)
    after_s: list[float] = field(default_factory=list)
    # B's jobs that did not succeed (status, error code), and how A's jobs ended.
    b_not_succeeded: list[str] = field(default_factory=list)
    a_outcomes: dict[str, int] = field(default_factory=dict)
    a_calls: int = 0
    a_jobs: int = 0


class _Client:
    """The public API over HTTP, as users A and B."""

    def __init__(self, http: httpx.AsyncClient, tokens: Mapping[str, str]) -> None:
        self.http = http
        self.tokens = tokens

    async def create(self, user: str, source: str) -> str:
        body = {
            "jobType": FLASH,
            "targetType": "lesson",
            "targetId": f"iso-{uuid.uuid4().hex[:12]}",
            "input": {"sourceText": source, "count": 2},
        }
        r = await self.http.post(
            "/api/ai/jobs", json=body, headers={"Authorization": f"Bearer {self.tokens[user]}"}
        )
        if r.status_code != 202:
            raise RuntimeError(f"create answered {r.status_code}: {r.text[:300]}")
        return str(r.json()["jobId"])

    async def wait_ended(self, user: str, job_id: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            r = await self.http.get(
                f"/api/ai/jobs/{job_id}", headers={"Authorization": f"Bearer {self.tokens[user]}"}
            )
            r.raise_for_status()
            body: dict[str, Any] = r.json()
            if body["lifecycleStatus"] in ("succeeded", "failed", "cancelled"):
                return body
            if time.monotonic() > deadline:
                return body
            await asyncio.sleep(POLL_S)

    async def timed_b_job(self, figures: Figures, timeout_s: float) -> float:
        started = time.monotonic()
        job = await self.create(USER_B, SOURCE)
        body = await self.wait_ended(USER_B, job, timeout_s)
        elapsed = time.monotonic() - started
        if body["lifecycleStatus"] != "succeeded":
            figures.b_not_succeeded.append(f"{body['lifecycleStatus']}/{body.get('errorCode')}")
        return elapsed


async def a_burst(api: _Client, tag: str) -> list[str]:
    """User A posts `A_JOBS` jobs that the provider rejects (each input carries `POISON`)."""
    return [await api.create(USER_A, f"{SOURCE} {POISON} {tag}.{n}") for n in range(A_JOBS)]


async def a_ended(api: _Client, figures: Figures, jobs: Sequence[str], timeout_s: float) -> None:
    for job in jobs:
        body = await api.wait_ended(USER_A, job, timeout_s)
        outcome = f"{body['lifecycleStatus']}/{body.get('errorCode')}"
        figures.a_outcomes[outcome] = figures.a_outcomes.get(outcome, 0) + 1
        figures.a_jobs += 1


async def _serve(app: Any) -> tuple[str, Any, asyncio.Task[None], socket.socket]:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    deadline = time.monotonic() + 30
    while not server.started:
        if task.done() or time.monotonic() > deadline:
            raise RuntimeError("the API did not start")
        await asyncio.sleep(0.02)
    return f"http://127.0.0.1:{port}", server, task, sock


async def scenario(
    database_url: str, temporal_address: str, fake: FakeLLM, reps: int, job_timeout_s: float
) -> Figures:
    """The engine in this process against `fake`; B alone, B during A's rejected jobs, B after."""
    from temporalio.client import Client

    from activities.relay import Relay
    from api.auth import JwtConfig, issue_token
    from bench.infra import progress
    from engine.settings import Settings
    from runtime.wiring import api_app, build_parts, relay_config
    from runtime.worker import build_workers

    # The rejected calls' activity failures are expected here; the worker logs each one.
    logging.getLogger("temporalio").setLevel(logging.ERROR)
    settings = Settings.model_validate(
        {
            "DATABASE_URL": database_url,
            "TEMPORAL_ADDRESS": temporal_address,
            "AIJOBS_ENV": "test",
            "TASK_QUEUE_SUFFIX": f"-iso{uuid.uuid4().hex[:8]}",
            "JWT_SECRET": JWT_SECRET,
            "QUOTA_MAX_ACTIVE_JOBS": 0,
            "QUOTA_MAX_JOBS_PER_DAY": 0,
            "WORKER_DRAIN_S": 0,
            "AI_BASE_URL": fake.base_url,
            "DEEPSEEK_API_KEY": PLATFORM_KEY,
            "AI_MODEL": MODEL,
            # fakellm's error rules hold for whole answers only (tests/e2e/...third_party.py).
            "AI_STREAM_DISABLED_MODELS": "*",
        }
    )
    figures = Figures(tree=_tree_name(), reps=reps)
    client = await Client.connect(temporal_address, namespace="default")
    parts = build_parts(settings)
    relay = Relay(parts.sessionmaker, client, parts.catalog, relay_config(settings))
    stop = asyncio.Event()
    jwt = JwtConfig.from_settings(settings)
    tokens = {u: issue_token(jwt, u) for u in (USER_A, USER_B)}
    base_url, server, server_task, sock = await _serve(api_app(settings, temporal=client))
    try:
        async with contextlib.AsyncExitStack() as es:
            for w in build_workers(client, parts, ("ai-interactive", "ai-background")):
                await es.enter_async_context(w)
            relay_task = asyncio.create_task(relay.run(stop=stop))
            http = await es.enter_async_context(httpx.AsyncClient(base_url=base_url, timeout=30))
            api = _Client(http, tokens)
            await api.timed_b_job(figures, job_timeout_s)  # warm-up: imports, pools, caches
            figures.b_not_succeeded.clear()
            for i in range(reps):
                figures.alone_s.append(await api.timed_b_job(figures, job_timeout_s))
                progress(f"isolation: B alone {i + 1}/{reps}: {figures.alone_s[-1]:.2f}s")
            calls_before = (await fake.calls()).get(RULE_TOO_LONG, 0)
            for i in range(reps):
                # During: B posts right after A's burst, so B's call lands among A's.
                a_jobs = await a_burst(api, f"d{i}")
                figures.during_s.append(await api.timed_b_job(figures, job_timeout_s))
                await a_ended(api, figures, a_jobs, job_timeout_s)
                # After: B sends nothing until A's burst has ended, then posts one job.
                a_jobs = await a_burst(api, f"a{i}")
                await a_ended(api, figures, a_jobs, job_timeout_s)
                figures.after_s.append(await api.timed_b_job(figures, job_timeout_s))
                progress(
                    f"isolation: rep {i + 1}/{reps}: B during A {figures.during_s[-1]:.2f}s, "
                    f"B after A {figures.after_s[-1]:.2f}s"
                )
            figures.a_calls = (await fake.calls()).get(RULE_TOO_LONG, 0) - calls_before
            stop.set()
            await asyncio.wait_for(relay_task, 10)
    finally:
        stop.set()
        server.should_exit = True
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(server_task, 15)
        sock.close()
        await parts.close()
    return figures


def _tree_name() -> str:
    """The git revision of the tree the engine's packages were imported from (not necessarily
    this file's: the old-code figure runs this file from another checkout)."""
    import activities

    tree = Path(activities.__file__).resolve().parents[1]
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=tree,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        rev = "unknown"
    return f"{rev} ({tree})"


def render(f: Figures) -> str:
    def med(xs: Sequence[float]) -> str:
        return f"{statistics.median(xs):.2f}" if xs else "-"

    def worst(xs: Sequence[float]) -> str:
        return f"{max(xs):.2f}" if xs else "-"

    per_job = f"{f.a_calls / f.a_jobs:.2f}" if f.a_jobs else "-"
    lines = [
        f"tenant isolation, tree {f.tree}",
        f"user B's flashcard job, POST -> succeeded over HTTP, s (median / max of {f.reps})",
        f"  {'B alone':<28}{med(f.alone_s):>8} / {worst(f.alone_s)}",
        f"  {'B during A (4 x 400)':<28}{med(f.during_s):>8} / {worst(f.during_s)}",
        f"  {'B just after A (4 x 400)':<28}{med(f.after_s):>8} / {worst(f.after_s)}",
        f"user A's rejected jobs: {f.a_jobs}, provider calls per job {per_job}, "
        f"ended {dict(sorted(f.a_outcomes.items()))}",
        f"user B's jobs that did not succeed: {f.b_not_succeeded or 'none'}",
    ]
    return "\n".join(lines)
