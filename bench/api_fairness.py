"""`python -m bench.api_fairness`: another user's reads while one user floods the API with
maximum-size creates and quotes (docs/benchmarks.md, "API fairness under one user's load").

The real API as a process (`aijobs api`, default settings but quotas off: API_RATE_LIMIT_*,
API_TOKEN_COUNT_* at their defaults) on an embedded PostgreSQL (`bench.infra.servers`); no
workers, so created jobs stay queued and only the API's work is measured. The flood runs in a
process of its own (`--flood`, so its client work does not delay the reader's): `--concurrency`
(16) loops of one user, each alternating a create and a quote of a quiz over a 400,000-character
source (bodies built once). The reader is another user reading its own job
(`GET /api/ai/jobs/{id}`) one request at a time.

Phases, in one run: `--rounds` (3) rounds of quiet (the reader alone, `--reads` reads) then load
(the reader beside a fresh flood, as many reads), interleaved so that a shared machine's drifting
load weighs on both alike. Figures: the reader's p50 and p95 under load (all rounds' reads) as
ratios of quiet (all rounds' quiet reads), per round too, and the flood's answers by status (a
429 RATE_LIMITED is the flood meeting its rate or the count pool's wait; a 5xx would be a
failure).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import httpx

from bench.stats import ratio, summary_ms

SOURCE_CHARS = 400_000


def long_source(chars: int) -> str:
    """Distinct sentences (each names its number), so the tokenizer never sees repeated text."""
    parts, size, i = [], 0, 0
    while size < chars:
        p = f"Paragraph {i} explains that enzyme{i} catalysts accelerate reaction{i} in cells. "
        parts.append(p)
        size, i = size + len(p), i + 1
    return "".join(parts)[:chars]


def max_body() -> bytes:
    return json.dumps(
        {
            "jobType": "quiz_generation",
            "targetType": "lesson",
            "targetId": "bench",
            "input": {"sourceText": long_source(SOURCE_CHARS), "count": 5},
        }
    ).encode()


# ---- the flood (its own process) -----------------------------------------------------------


async def flood(base_url: str, token: str, concurrency: int) -> None:
    """Until SIGTERM: `concurrency` loops of create, quote, create, ...; then prints the
    answers by status as JSON."""
    body = max_body()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    counts: Counter[str] = Counter()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    started = time.monotonic()

    async def loop(i: int, c: httpx.AsyncClient) -> None:
        paths = ("/api/ai/jobs", "/api/ai/jobs/quote")
        n = i
        while not stop.is_set():
            try:
                r = await c.post(paths[n % 2], content=body, headers=headers)
                code = r.json().get("code", "") if r.status_code >= 400 else ""
                counts[f"{r.status_code} {code}".strip()] += 1
            except httpx.HTTPError as exc:
                counts[type(exc).__name__] += 1
            n += 1
            if sum(counts.values()) == concurrency:
                print("flooding", flush=True)

    async with httpx.AsyncClient(base_url=base_url, timeout=60) as c:
        tasks = [asyncio.create_task(loop(i, c)) for i in range(concurrency)]
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    seconds = time.monotonic() - started
    print(json.dumps({"answers": dict(counts), "seconds": seconds}), flush=True)


async def burst(base_url: str, token: str, n: int) -> None:
    """`n` maximum-size requests sent at once, creates and quotes alternately, each once; then
    prints their answers by status and the slowest answer's time as JSON."""
    body = max_body()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    paths = ("/api/ai/jobs", "/api/ai/jobs/quote")

    async def one(i: int, c: httpx.AsyncClient) -> tuple[str, float]:
        t = time.monotonic()
        try:
            r = await c.post(paths[i % 2], content=body, headers=headers)
            code = r.json().get("code", "") if r.status_code >= 400 else ""
            return f"{r.status_code} {code}".strip(), time.monotonic() - t
        except httpx.HTTPError as exc:
            return type(exc).__name__, time.monotonic() - t

    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as c:
        print("flooding", flush=True)
        done = await asyncio.gather(*(one(i, c) for i in range(n)))
    answers = Counter(status for status, _ in done)
    slowest = max(seconds for _, seconds in done)
    print(json.dumps({"answers": dict(answers), "slowest_s": slowest}), flush=True)


# ---- the run ------------------------------------------------------------------------------


async def reads(c: httpx.AsyncClient, path: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = await c.get(path)
        out.append(time.perf_counter() - t)
        assert r.status_code == 200, r.text
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from api.auth import issue_token
    from bench.infra import BENCH_JWT_SECRET, EngineKnobs, engine_env, servers
    from bench.procs import Proc, progress
    from runtime.embedded import free_port

    with servers(keep=False) as sv:
        extra = dict(kv.split("=", 1) for kv in args.env)
        knobs = EngineKnobs(interactive_concurrency=1, log_level="WARNING", extra_env=extra)
        env = engine_env(sv, knobs, suffix="-benchfair", quotas=False)
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        cli = [sys.executable, "-m", "runtime.cli", "api", "--host", "127.0.0.1"]
        api = Proc("api", [*cli, "--port", str(port)], env, sv.log_dir)
        api.start()
        reader = {"Authorization": f"Bearer {issue_token(BENCH_JWT_SECRET, 'reader')}"}
        quiet: list[float] = []
        loaded: list[float] = []
        rounds: list[dict[str, Any]] = []
        async with httpx.AsyncClient(base_url=base_url, timeout=60, headers=reader) as c:
            await _wait_healthy(c)
            job = {"jobType": "synthetic", "targetType": "lesson", "targetId": "r", "input": {}}
            created = await c.post("/api/ai/jobs", json=job)
            assert created.status_code == 202, created.text
            path = f"/api/ai/jobs/{created.json()['jobId']}"
            await reads(c, path, 50)  # warm-up: pool connections, code paths
            token = issue_token(BENCH_JWT_SECRET, "heavy")
            for i in range(args.rounds):
                what = f"a burst of {args.burst}" if args.burst else f"{args.concurrency} flooders"
                progress(f"round {i + 1}: quiet, then beside {what}")
                q = await reads(c, path, args.reads)
                ld, answers = await _beside_flood(args, base_url, token, c, path)
                quiet += q
                loaded += ld
                rounds.append(_figures(q, ld) | {"flood": answers})
        api.stop()
    return {
        "concurrency": args.concurrency,
        "burst": args.burst,
        "env": args.env,
        "source_chars": SOURCE_CHARS,
        **_figures(quiet, loaded),
        "rounds": rounds,
    }


def _figures(quiet: list[float], loaded: list[float]) -> dict[str, Any]:
    q, ld = summary_ms(quiet), summary_ms(loaded)
    return {
        "quiet": q,
        "load": ld,
        "p50_ratio": ratio(ld["p50_ms"], q["p50_ms"]),
        "p95_ratio": ratio(ld["p95_ms"], q["p95_ms"]),
    }


async def _beside_flood(
    args: argparse.Namespace, base_url: str, token: str, c: httpx.AsyncClient, path: str
) -> tuple[list[float], dict[str, Any]]:
    """The reader's reads while a flood process runs (started, and answering, before the first
    read; stopped after the last), or while a burst's requests are answered (from its first
    request to its last answer); returns them and the flood's answers."""
    flood_argv = ["--flood", base_url, "--token", token, "--concurrency", str(args.concurrency)]
    flood_argv += ["--burst", str(args.burst)]
    flooder = subprocess.Popen(
        [sys.executable, "-m", "bench.api_fairness", *flood_argv],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert flooder.stdout is not None
    assert flooder.stdout.readline().strip() == "flooding"
    loaded: list[float] = []
    while args.burst and flooder.poll() is None:
        loaded += await reads(c, path, 1)
    if not args.burst:
        loaded = await reads(c, path, args.reads)
        flooder.send_signal(signal.SIGTERM)
    answers: dict[str, Any] = json.loads(
        flooder.communicate(timeout=120)[0].strip().splitlines()[-1]
    )
    await asyncio.sleep(1.0)  # the checks the flood left in flight finish (a few tenths each)
    return loaded, answers


async def _wait_healthy(c: httpx.AsyncClient) -> None:
    for _ in range(600):
        with contextlib.suppress(httpx.HTTPError):
            if (await c.get("/healthz")).status_code == 200:
                return
        await asyncio.sleep(0.1)
    raise TimeoutError("the API did not start")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.api_fairness")
    p.add_argument("--concurrency", type=int, default=16, help="the flooder's concurrent loops")
    p.add_argument(
        "--burst",
        type=int,
        default=0,
        help="instead of the flood: this many requests at once, each once (the reader reads "
        "until the last is answered)",
    )
    p.add_argument("--reads", type=int, default=150, help="the reader's reads per phase")
    p.add_argument("--rounds", type=int, default=3, help="rounds of a quiet and a load phase")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the API process (e.g. DB_POOL_SIZE=20); repeatable",
    )
    p.add_argument("--flood", metavar="BASE_URL", help=argparse.SUPPRESS)
    p.add_argument("--token", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.flood and args.burst:
        asyncio.run(burst(args.flood, args.token, args.burst))
        return
    if args.flood:
        asyncio.run(flood(args.flood, args.token, args.concurrency))
        return
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
