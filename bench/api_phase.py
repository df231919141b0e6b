"""Phase D of `python -m bench`: the API server's real routes interleaved with bare routes
(figure 4), driven by wrk (or a Python fallback); then each route's round trips to PostgreSQL
(`bench/statements.py`).

The tables are seeded afresh before each repetition and emptied after the phase, so the jobs the
routes create never reach a later stack's relay.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.infra import BENCH_JWT_SECRET, EngineKnobs, Servers, engine_env
from bench.procs import Proc, check_alive, progress
from bench.report import Results
from bench.stats import median, ratio
from bench.wrk import WRK_THREADS

API_GET_JOBS = 256  # seeded jobs the GET routes read, one user each
API_POST_USERS = 4096  # creating users, so per-user quotas never bind


async def wait_http(url: str, timeout_s: float, procs: list[Proc]) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as c:
        while True:
            check_alive(procs)
            with contextlib.suppress(httpx.HTTPError):
                if (await c.get(url, timeout=1.0)).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not ready in {timeout_s:.0f}s")
            await asyncio.sleep(0.2)


@dataclass(frozen=True)
class _Callers:
    """The API figure's callers: each GET user owns one seeded job; the POST users are many, so
    per-user quotas never bind."""

    get_users: list[str]
    get_auth: list[str]
    post_auth: list[str]

    @classmethod
    def make(cls) -> _Callers:
        from api.auth import issue_token

        get_users = [f"bench-api-get-{k}" for k in range(API_GET_JOBS)]
        return cls(
            get_users=get_users,
            get_auth=["Bearer " + issue_token(BENCH_JWT_SECRET, u) for u in get_users],
            post_auth=[
                "Bearer " + issue_token(BENCH_JWT_SECRET, f"bench-api-post-{k}")
                for k in range(API_POST_USERS)
            ],
        )


def _api_server(
    args: argparse.Namespace, sv: Servers, knobs: EngineKnobs
) -> tuple[Proc, dict[str, str], str]:
    """The API server process (not started), its environment and its base URL."""
    from runtime.embedded import free_port

    port = free_port()
    env = engine_env(
        sv, knobs, suffix=f"-benchapi{uuid.uuid4().hex[:8]}", quotas=args.api_quotas == "default"
    )
    api = Proc(
        "api",
        [sys.executable, "-m", "bench.api_server", "--host", "127.0.0.1", "--port", str(port)],
        env,
        sv.log_dir,
    )
    return api, env, f"http://127.0.0.1:{port}"


def _load_for(
    args: argparse.Namespace,
    res: Results,
    base_url: str,
    work_dir: Path,
    ids: list[str],
    callers: _Callers,
) -> tuple[dict[str, Any], _LoadFn]:
    """The load generator (wrk when installed, else the Python fallback), named in the figure."""
    from bench.wrk import wrk_path, wrk_version

    get_auth, post_auth = callers.get_auth, callers.post_auth
    wrk = wrk_path() if args.api_client != "python" else None
    if wrk is None and args.api_client == "wrk":
        raise RuntimeError("--api-client wrk: wrk is not on PATH (make bench installs it)")
    f = res.fig("api")
    if wrk is not None:
        f["client"] = "wrk"
        f["client_version"] = wrk_version(wrk)
        return f, _wrk_load(wrk, args, base_url, work_dir, ids, get_auth, post_auth)
    # The Python client shares the bench process (and its CPU) with nothing else, but it
    # saturates a core long before the server does: only a fallback.
    chosen = args.api_client == "python"
    if not chosen:
        progress("api: wrk not found on PATH; falling back to the Python client")
    f["client"] = "python (--api-client python)" if chosen else "python (wrk not installed)"
    return f, _python_load(args, base_url, ids, get_auth, post_auth)


async def _seed(ctx: Any, callers: _Callers, ids: list[str]) -> None:
    """One job per GET user, on empty tables, its id in `ids`."""
    from jobs.service import CreateJobRequest

    await ctx.admin.wait_quiet()  # the requests of the last load still running
    await ctx.edb.truncate()
    ids.clear()
    for u in callers.get_users:
        r = await ctx.svc.create(
            CreateJobRequest(
                user_id=u, job_type="synthetic", target_type="bench", target_id="t1", input={}
            )
        )
        ids.append(str(r.job.id))


async def _drive(
    ctx: Any,
    args: argparse.Namespace,
    api: Proc,
    base_url: str,
    load: _LoadFn,
    seed: Callable[[], Awaitable[None]],
    client: str,
) -> dict[str, list[dict[str, Any]]]:
    """Start the server, warm each route up, then load each route once per repetition on
    freshly seeded tables."""
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in API_ROUTES}
    api.start()
    await wait_http(f"{base_url}/healthz", 60, [api])
    ctx.watch = [api]
    await seed()
    progress(f"api: warm-up {args.api_warmup_seconds:g}s per route ({client})")
    for name in API_ROUTES:
        await load(name, args.api_warmup_seconds, api.pid)
    for r in range(args.reps):
        await seed()
        for name in API_ROUTES:
            out = await load(name, args.api_seconds, api.pid)
            check_alive([api])
            progress(
                f"api rep {r + 1}/{args.reps}: {name:9s} {out['req_per_s']:7.0f} req/s "
                f"p99 {out['p99_ms']:6.1f} ms (non-2xx {out['non_2xx']}, client cpu "
                f"{out['client_cpu_pct']:.0f}%, server cpu {out['server_cpu_pct']:.0f}%)"
            )
            runs[name].append(out)
    return runs


async def phase_api(
    ctx: Any, args: argparse.Namespace, sv: Servers, knobs: EngineKnobs, res: Results
) -> None:
    api, env, base_url = _api_server(args, sv, knobs)
    callers = _Callers.make()
    ids: list[str] = []
    f, load = _load_for(args, res, base_url, sv.base, ids, callers)
    try:
        runs = await _drive(
            ctx, args, api, base_url, load, lambda: _seed(ctx, callers, ids), f["client"]
        )
    finally:
        ctx.watch = []
        api.stop()
        res.record_procs([api])
        with contextlib.suppress(Exception):
            await ctx.edb.truncate()
    try:
        f["statements"] = await _create_path_statements(env)
    finally:
        await ctx.edb.truncate()  # its jobs' enqueue rows must not reach a later stack's relay
    _summarize(args, res, f, runs)


def _summarize(
    args: argparse.Namespace,
    res: Results,
    f: dict[str, Any],
    runs: dict[str, list[dict[str, Any]]],
) -> None:
    """Each route's medians, and each real route against its bare twin (errors recorded)."""
    for name, rr in runs.items():
        f[name] = {
            "reps": rr,
            "median_req_per_s": median([x["req_per_s"] for x in rr]),
            "median_p50_ms": median([x["p50_ms"] for x in rr]),
            "median_p99_ms": median([x["p99_ms"] for x in rr]),
            "median_client_cpu_pct": median([x["client_cpu_pct"] for x in rr]),
            "median_server_cpu_pct": median([x["server_cpu_pct"] for x in rr]),
            "non_2xx": sum(x["non_2xx"] for x in rr),
            "transport_errors": sum(sum(x["transport_errors"].values()) for x in rr),
        }
    f["idempotency_keys"] = "distinct" if args.api_idempotency_keys else "none"
    for route, bare, target in (("get", "get_bare", 0.8), ("post", "post_bare", 0.6)):
        f[f"{route}_ratio"] = ratio(f[route]["median_req_per_s"], f[bare]["median_req_per_s"])
        f[f"{route}_target"] = f">= {target}"
        f[f"{route}_met"] = f[f"{route}_ratio"] >= target
        if f[route]["non_2xx"] or f[bare]["non_2xx"]:
            res.data["errors"].append(
                {"where": "api", "error": f"non-2xx answers on {route}/{bare}; see the reps"}
            )
        if f[route]["transport_errors"] or f[bare]["transport_errors"]:
            res.data["errors"].append(
                {"where": "api", "error": f"transport errors on {route}/{bare}; see the reps"}
            )


async def _create_path_statements(env: dict[str, str]) -> dict[str, Any]:
    """The round trips of one real create and one real read (`bench/statements.py`, in a
    process of its own with the API server's environment), and of the bare routes."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.statements",
        "--requests",
        "20",
        "--jwt-secret",
        BENCH_JWT_SECRET,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"bench.statements failed: {err.decode()[-2000:]}")
    counted: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    progress(
        f"api: round trips per request: POST {counted['post']['round_trips']:g} "
        f"(bare {counted['post_bare']['round_trips']:g}), GET "
        f"{counted['get']['round_trips']:g} (bare {counted['get_bare']['round_trips']:g})"
    )
    return counted


API_ROUTES = ("get", "get_bare", "post", "post_bare")
_POST_BODY = json.dumps(
    {"jobType": "synthetic", "targetType": "bench", "targetId": "t1", "input": {}}
)
_LoadFn = Callable[[str, float, int], Awaitable[dict[str, Any]]]


def _wrk_load(
    wrk: str,
    args: argparse.Namespace,
    base_url: str,
    work_dir: Path,
    ids: list[str],
    get_auth: list[str],
    post_auth: list[str],
) -> _LoadFn:
    """One wrk run per call; the GET scripts are written per call, as the seeded ids change."""
    from bench.wrk import run_wrk, script_keyed_post, script_rotating

    json_ct = {"Content-Type": "application/json"}

    def script(name: str) -> str:
        if name == "get":
            return script_rotating(
                [
                    ("GET", f"/api/ai/jobs/{i}", {"Authorization": a}, None)
                    for i, a in zip(ids, get_auth, strict=True)
                ]
            )
        if name == "get_bare":
            return script_rotating([("GET", f"/bench/jobs/{i}", {}, None) for i in ids])
        if name == "post":
            if args.api_idempotency_keys:
                return script_keyed_post("/api/ai/jobs", post_auth, _POST_BODY)
            return script_rotating(
                [
                    ("POST", "/api/ai/jobs", {"Authorization": a, **json_ct}, _POST_BODY)
                    for a in post_auth
                ]
            )
        return script_rotating([("POST", "/bench/jobs", json_ct, _POST_BODY)])

    async def load(name: str, seconds: float, server_pid: int) -> dict[str, Any]:
        return await run_wrk(
            wrk,
            base_url + "/",
            script(name),
            threads=WRK_THREADS,
            connections=args.api_connections,
            seconds=seconds,
            server_pid=server_pid,
            work_dir=work_dir,
        )

    return load


def _python_load(
    args: argparse.Namespace,
    base_url: str,
    ids: list[str],
    get_auth: list[str],
    post_auth: list[str],
) -> _LoadFn:
    from bench.loadgen import Request, http_load

    body = _POST_BODY.encode()
    json_ct = {"content-type": "application/json"}
    m = len(get_auth)
    key_prefix = uuid.uuid4().hex[:12]

    def post(i: int) -> Request:
        headers = {"authorization": post_auth[i % API_POST_USERS], **json_ct}
        if args.api_idempotency_keys:
            headers["idempotency-key"] = f"{key_prefix}-{i}"
        return Request("POST", "/api/ai/jobs", headers, body)

    routes: dict[str, Callable[[int], Request]] = {
        "get": lambda i: Request(
            "GET", f"/api/ai/jobs/{ids[i % m]}", {"authorization": get_auth[i % m]}
        ),
        "get_bare": lambda i: Request("GET", f"/bench/jobs/{ids[i % m]}", {}),
        "post": post,
        "post_bare": lambda i: Request("POST", "/bench/jobs", json_ct, body),
    }

    async def load(name: str, seconds: float, server_pid: int) -> dict[str, Any]:
        out = await http_load(
            base_url,
            routes[name],
            seconds=seconds,
            connections=args.api_connections,
            server_pid=server_pid,
        )
        out["client"] = "python"
        out["non_2xx"] = sum(v for k, v in out["status_codes"].items() if int(k) >= 300)
        return out

    return load
