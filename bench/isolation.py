"""`python -m bench.isolation`: does one user's rejected requests slow another user's jobs?

The provider is fakellm (a third party's OpenAI-compatible mock server, PyPI `fakellm`), run as a
subprocess with YAML rules: a call whose messages carry `POISON` is answered HTTP 400 "This
model's maximum context length is 65536 tokens..." (what DeepSeek and OpenAI answer an
oversized request), every other call a valid flashcard answer. The engine runs in this process
as the tests run it (embedded PostgreSQL and Temporal dev server from `bench.infra.servers`,
the workers and the outbox relay in process, the API under uvicorn on 127.0.0.1), with the
default breaker settings; jobs are created and polled over HTTP as a client would.

User B's latency is the wall time from B's POST /api/ai/jobs to the first GET that reads
`succeeded` (polled every 50 ms), for one `flashcard_generation` job at a time:
- alone: `--reps` jobs on the idle engine;
- during A: user A posts 4 jobs whose input carries `POISON` (a burst), then B posts one at
  once, so B's call lands among A's rejected ones;
- after A: A posts another burst of 4 and B sends nothing until all 4 have ended, then posts
  one job: what a user meets who arrives just after another user's burst of bad requests.
Each repetition runs one of each.
Repetitions run back to back: whatever A's jobs left behind (a paused key, an open breaker) is
what B's next job meets, as it would be in production.

The same file runs against an older checkout of the engine (copy it into that tree's `bench/`
and run it from there: every import then resolves to that tree), which is how docs/benchmarks.md
compares the code before and after provider failures were classified by whose problem they are.

`FakeLLM`, `fakellm_server` and `isolation_rules` are shared with
tests/e2e/test_isolation_third_party.py, so the test and the figure see the same provider.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

MODEL = "deepseek-chat"
# Only user A's jobs carry this text: fakellm's `messages_contain` rule answers them with 400.
POISON = "Zyxwv-tenant-A-oversized-marker"
TOO_LONG = (
    "This model's maximum context length is 65536 tokens. However, you requested 70412 tokens "
    "(66316 in the messages, 4096 in the completion). Please reduce the length of the messages "
    "or completion."
)
OUT_OF_BALANCE = "Insufficient Balance"
RATE_LIMITED = "Rate limit reached for requests"
# fakellm names the rule each call matched in its stats: the names say which answer it was.
RULE_TOO_LONG = "too-long"
RULE_VALID = "valid"
PLATFORM_KEY = "sk-bench-platform-key-0000"
JWT_SECRET = "bench-only-jwt-secret-not-for-production"
USER_A = "bench-a"
USER_B = "bench-b"
A_JOBS = 4
FLASH = "flashcard_generation"
SOURCE = (
    "Photosynthesis converts light energy into chemical energy. It takes place in the "
    "chloroplasts of plant cells."
)
ANSWER: dict[str, Any] = {
    "flashcards": [
        {"front": "What does photosynthesis convert?", "back": "Light into chemical energy."},
        {"front": "Where does it take place?", "back": "In the chloroplasts."},
    ]
}
POLL_S = 0.05


def balance_rule(i: int) -> str:
    return f"out-of-balance-{i}"


def rate_limit_rule(i: int) -> str:
    return f"rate-limited-{i}"


def isolation_rules(
    answer: Mapping[str, Any],
    *,
    poison: str = POISON,
    out_of_balance_keys: Sequence[str] = (),
    rate_limited_keys: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """fakellm rules, first match wins: calls made with one of `out_of_balance_keys` get 402,
    with one of `rate_limited_keys` 429 (fakellm sends no Retry-After), calls whose messages
    contain `poison` 400 "maximum context length", and every other call `answer` (serialised
    JSON, as a model asked for a JSON object answers). The keys are matched on the
    Authorization header; rule names carry indexes, never keys."""
    rules: list[dict[str, Any]] = []
    for i, key in enumerate(out_of_balance_keys):
        rules.append(
            {
                "name": balance_rule(i),
                "when": {"header.authorization": f"Bearer {key}"},
                "respond": {"status": 402, "error": OUT_OF_BALANCE},
            }
        )
    for i, key in enumerate(rate_limited_keys):
        rules.append(
            {
                "name": rate_limit_rule(i),
                "when": {"header.authorization": f"Bearer {key}"},
                "respond": {"status": 429, "error": RATE_LIMITED},
            }
        )
    rules.append(
        {
            "name": RULE_TOO_LONG,
            "when": {"messages_contain": poison},
            "respond": {"status": 400, "error": TOO_LONG},
        }
    )
    rules.append({"name": RULE_VALID, "respond": {"content": json.dumps(answer)}})
    return rules


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class FakeLLM:
    """A running `fakellm serve`: its URLs, and what it says it answered."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (`.../v1`) the engine's AI_BASE_URL takes."""
        return f"{self.root_url}/v1"

    async def calls(self) -> dict[str, int]:
        """Calls answered so far, by rule name (fakellm's own count: its `/_fakellm/stats`)."""
        async with httpx.AsyncClient(timeout=10) as c:
            r = await c.get(f"{self.root_url}/_fakellm/stats")
            r.raise_for_status()
            by_rule: dict[str, int] = r.json()["by_rule"]
            return by_rule

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@contextlib.asynccontextmanager
async def fakellm_server(
    rules: Sequence[Mapping[str, Any]], workdir: Path, *, start_timeout_s: float = 30.0
) -> AsyncIterator[FakeLLM]:
    """`fakellm serve` on a free 127.0.0.1 port with `rules`, ready (it answered its stats
    endpoint) when this yields, stopped (SIGTERM, then SIGKILL) when it returns.

    The port is probed free and then bound by the child: another process could take it in
    between, which shows as a start failure with the child's log."""
    config = workdir / "fakellm.yaml"
    config.write_text(yaml.safe_dump({"version": 1, "rules": list(rules)}, sort_keys=False))
    port = _free_port()
    log_path = workdir / "fakellm.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fakellm.cli",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--config",
                str(config),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    fake = FakeLLM(proc, port, log_path)
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"fakellm exited with {proc.returncode}:\n{fake.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                await fake.calls()
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"fakellm did not answer in {start_timeout_s:g}s")
            await asyncio.sleep(0.05)
        yield fake
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait, 10)


# ---- the scenario -------------------------------------------------------------------------


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
    from bench.procs import progress
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


async def run(args: argparse.Namespace) -> Figures:
    from bench.infra import servers
    from bench.procs import progress

    with servers(keep=False) as sv, tempfile.TemporaryDirectory(prefix="fakellm-") as tmp:
        async with fakellm_server(isolation_rules(ANSWER), Path(tmp)) as fake:
            progress(f"isolation: fakellm on {fake.root_url}")
            return await scenario(
                sv.database_url, sv.temporal_address, fake, args.reps, args.job_timeout_s
            )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.isolation",
        description="User B's job latency alone, during and after user A's rejected requests.",
    )
    p.add_argument("--reps", type=int, default=5, help="jobs per figure (5)")
    p.add_argument(
        "--job-timeout-s",
        type=float,
        default=300.0,
        help="give up waiting for one job after this long (300)",
    )
    p.add_argument("--output", help="also write the figures as JSON here")
    args = p.parse_args(argv)
    figures = asyncio.run(run(args))
    print(render(figures))
    if args.output:
        Path(args.output).write_text(json.dumps(asdict(figures), indent=2))
    from bench.teardown import hard_exit

    hard_exit(0)


if __name__ == "__main__":
    main()
