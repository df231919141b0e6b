"""`python -m bench.tiers`: what each service tier costs and what the batch path costs the engine
(docs/benchmarks.md, "Service tiers: cost per 1,000 jobs and the batch path's overhead").

The real stack as processes (as `bench.stream_items`): an embedded PostgreSQL and a headless
Temporal dev server, the API (`bench.api_server`), `aijobs relay` and one `aijobs worker --queue
ai-interactive`, and as the provider the test suite's OpenAI-compatible mock
(`tests/fakes/openai_server.py`, its own process, with its Files and Batches endpoints), which
answers every call (a chat call, or a batch's line) with the same flashcard deck and the same
usage (`--tokens-in`, `--tokens-out`), so the phases differ only in their tier.

Four phases, `--jobs` flashcard jobs each (after a one-job warm-up), each on a stack of its own:

- standard: `serviceTier` left out: one chat call per job;
- batch: `serviceTier: "batch"` with AI_BATCH_WINDOW_S `--window` and AI_BATCH_POLL_S `--poll`:
  the jobs go to the provider as batch files;
- offpeak: `serviceTier: "offpeak"` with a discount window open now (AI_OFFPEAK_WINDOWS for the
  mock's provider, at `--offpeak-price`);
- reused: one job, then `--jobs` identical creates with `reuse: "allow"`.

Per phase, from the engine's own usage rows (`ai_usage_log`, priced by the engine at the table's
prices): the cost per 1,000 jobs and its ratio to standard; and what the engine spent per job:
the worker's CPU (`/proc/<pid>/stat`), the database's committed transactions
(`pg_stat_database.xact_commit`, less the bench client's own list reads, whose cost is measured
on the quiet stack first), the chat calls and batches the mock received, and the wall
time from the first create to the last job's success. The batch path's overhead is its row over
standard's, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx

from bench.infra import BENCH_JWT_SECRET, Admin, EngineKnobs, EngineStack, Servers, engine_env
from bench.procs import Proc, process_cpu_s, progress

FAKE_KEY = "sk-bench-fake-provider-key"
MODEL = "gpt-4o-mini"  # a built-in model with a published batch price
SOURCE = (
    "Photosynthesis converts light into chemical energy. It takes place in the chloroplasts, "
    "and releases oxygen from split water."
)
DECK = {
    "flashcards": [
        {"front": "What does photosynthesis convert?", "back": "Light into chemical energy."},
        {"front": "Where does it take place?", "back": "In the chloroplasts."},
        {"front": "What is released?", "back": "Oxygen, from splitting water."},
    ]
}


def open_window(now: datetime, price: float) -> str:
    """AI_OFFPEAK_WINDOWS with a window around `now` for the mock's provider."""
    start, end = now - timedelta(hours=1), now + timedelta(hours=2)
    window = {"start": start.strftime("%H:%M"), "end": end.strftime("%H:%M"), "price": price}
    return json.dumps({"openai_compatible": [window]})


async def _wait_ready(http: httpx.AsyncClient) -> None:
    for _ in range(300):
        try:
            if (await http.get("/healthz")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError("the API did not answer /healthz")


async def _create(http: httpx.AsyncClient, token: str, n: int, body: dict[str, Any]) -> str:
    payload = {
        "jobType": "flashcard_generation",
        "targetType": "bench",
        "targetId": f"t{n}",
        "input": {"sourceText": SOURCE, "count": 3},
        **body,
    }
    r = await http.post("/api/ai/jobs", json=payload, headers={"Authorization": f"Bearer {token}"})
    if r.status_code not in (200, 202):
        raise RuntimeError(f"create answered {r.status_code}: {r.text[:300]}")
    return str(r.json()["jobId"])


async def _list_poll(http: httpx.AsyncClient, token: str) -> dict[str, str]:
    """One read of the user's jobs (at most 100: a phase's jobs and its warm-up)."""
    r = await http.get(
        "/api/ai/jobs", params={"limit": 100}, headers={"Authorization": f"Bearer {token}"}
    )
    r.raise_for_status()
    return {item["jobId"]: item["lifecycleStatus"] for item in r.json()["items"]}


async def _wait_done(http: httpx.AsyncClient, token: str, ids: list[str], timeout_s: float) -> int:
    """Until every job succeeded; returns the list reads it took (the bench client polls one
    list every 0.25 s, the engine does not poll; the reads' own commits are taken off)."""
    deadline = time.monotonic() + timeout_s
    polls = 0
    while True:
        seen = await _list_poll(http, token)
        polls += 1
        states = [seen.get(job_id, "queued") for job_id in ids]
        bad = [s for s in states if s in ("failed", "cancelled")]
        if bad:
            raise RuntimeError(f"{len(bad)} jobs ended {bad[0]}")
        if all(s == "succeeded" for s in states):
            return polls
        if time.monotonic() > deadline:
            raise TimeoutError(f"{states.count('succeeded')}/{len(ids)} jobs succeeded")
        await asyncio.sleep(0.25)


async def _commits_per_read(http: httpx.AsyncClient, token: str, admin: Admin) -> float:
    """The database commits one list read costs, measured on the quiet stack."""
    before = await admin.xact_commit()
    for _ in range(20):
        await _list_poll(http, token)
    await admin.wait_quiet()
    return (await admin.xact_commit() - before) / 20


async def _usage(database_url: str, ids: list[str]) -> dict[str, Any]:
    """The phase's usage rows as the engine wrote them: calls, cost, tiers."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute(
            "SELECT count(*), coalesce(sum(cost_usd), 0), "
            "coalesce(array_agg(DISTINCT service_tier), '{}') "
            "FROM ai_usage_log WHERE job_id = ANY(%s::uuid[])",
            (ids,),
        )
        calls, cost, tiers = await cur.fetchone() or (0, Decimal(0), [])
    return {"calls": int(calls), "cost_usd": Decimal(cost), "tiers": sorted(tiers or [])}


async def _mock_seen(http: httpx.AsyncClient, root: str) -> tuple[int, int]:
    """The mock's chat calls and the batches created at it so far."""
    calls = (await http.get(f"{root}/_calls")).json()
    batches = (await http.get(f"{root}/_batches")).json()
    return int(calls["count"]), len(batches["batches"])


async def phase(
    name: str,
    args: argparse.Namespace,
    sv: Servers,
    body: dict[str, Any],
    extra: dict[str, str],
) -> dict[str, Any]:
    """One stack with `extra` settings: a warm-up job, then `--jobs` creates sent at once."""
    from temporalio.client import Client

    from api.auth import issue_token
    from runtime.embedded import free_port

    root = f"http://127.0.0.1:{args.fake_port}"
    knobs = EngineKnobs(
        interactive_concurrency=4,
        log_level="WARNING",
        extra_env={
            "AI_BASE_URL": f"{root}/v1",
            "DEEPSEEK_API_KEY": FAKE_KEY,
            "AI_MODEL": MODEL,
            "AI_STREAM_DISABLED_MODELS": "*",
            **extra,
        },
    )
    stack = EngineStack(name, sv, knobs, workers=1)
    api_port = free_port()
    api = Proc(
        f"{name}-api",
        [sys.executable, "-m", "bench.api_server", "--host", "127.0.0.1", "--port", str(api_port)],
        engine_env(sv, knobs, suffix=stack.suffix, quotas=False),
        sv.log_dir,
    )
    api.start()
    client = await Client.connect(sv.temporal_address, namespace="default")
    admin = Admin(sv.admin_uri)
    await admin.open()
    token = issue_token(BENCH_JWT_SECRET, f"bench-{name}")
    try:
        await stack.start(client, admin)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{api_port}", timeout=600, trust_env=False
        ) as http:
            m = await _measure(http, token, admin, stack, root, args, body, sv)
    finally:
        await admin.close()
        stack.stop()
        api.stop()
    n = args.jobs
    usage = m["usage"]
    return {
        "phase": name,
        "jobs": n,
        "calls_per_job": round(usage["calls"] / n, 2),
        "usage_tiers": usage["tiers"],
        "cost_per_1000_jobs_usd": str((usage["cost_usd"] * 1000 / n).quantize(Decimal("0.0001"))),
        "wall_s": round(m["wall"], 2),
        "worker_cpu_ms_per_job": round(m["cpu"] * 1000 / n, 1),
        "commits_per_job": round(m["commits"] / n, 1),
        "chat_calls": m["chat_calls"],
        "batches": m["batches"],
    }


async def _measure(
    http: httpx.AsyncClient,
    token: str,
    admin: Admin,
    stack: EngineStack,
    root: str,
    args: argparse.Namespace,
    body: dict[str, Any],
    sv: Servers,
) -> dict[str, Any]:
    """The warm-up, then `--jobs` creates at once, measured from the first create to the last
    success: the worker's CPU, the commits (less the client's reads), the mock's calls and
    batches, and the jobs' usage rows."""
    await _wait_ready(http)
    step = {"kind": "valid", "content": DECK, "tokens_in": args.tokens_in}
    step["tokens_out"] = args.tokens_out
    await http.post(f"{root}/_reset")
    await http.post(f"{root}/_script", json={"steps": [], "default": step, "rules": []})
    warm = await _create(http, token, 0, body)  # imports, pools; a reused phase's source
    await _wait_done(http, token, [warm], args.timeout)
    await admin.wait_quiet()
    per_read = await _commits_per_read(http, token, admin)
    seen0 = await _mock_seen(http, root)
    commits = await admin.xact_commit()
    cpu = process_cpu_s(stack.workers[0].pid)
    t0 = time.perf_counter()
    ids = await asyncio.gather(*(_create(http, token, i + 1, body) for i in range(args.jobs)))
    polls = await _wait_done(http, token, list(ids), args.timeout)
    wall = time.perf_counter() - t0
    cpu = process_cpu_s(stack.workers[0].pid) - cpu
    await admin.wait_quiet()
    spent = await admin.xact_commit() - commits - polls * per_read
    seen = await _mock_seen(http, root)
    return {
        "usage": await _usage(sv.database_url, list(ids)),
        "wall": wall,
        "cpu": cpu,
        "commits": spent,
        "chat_calls": seen[0] - seen0[0],
        "batches": seen[1] - seen0[1],
    }


def ratios(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Each phase over standard: cost, worker CPU, commits, wall time."""
    base = rows["standard"]
    out: dict[str, dict[str, float | None]] = {}
    for name, row in rows.items():
        out[name] = {}
        for key in ("cost_per_1000_jobs_usd", "worker_cpu_ms_per_job", "commits_per_job", "wall_s"):
            b = float(base[key])
            out[name][key] = round(float(row[key]) / b, 3) if b else None
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.infra import servers
    from runtime.embedded import free_port

    phases = {
        "standard": ({}, {}),
        "batch": (
            {"serviceTier": "batch"},
            {"AI_BATCH_WINDOW_S": str(args.window), "AI_BATCH_POLL_S": str(args.poll)},
        ),
        "offpeak": (
            {"serviceTier": "offpeak"},
            {"AI_OFFPEAK_WINDOWS": open_window(datetime.now(UTC), args.offpeak_price)},
        ),
        "reused": ({"reuse": "allow"}, {}),
    }
    rows: dict[str, dict[str, Any]] = {}
    with servers(keep=False) as sv:
        args.fake_port = free_port()
        fake = Proc(
            "fake-provider",
            [sys.executable, "-m", "tests.fakes.openai_server", "--port", str(args.fake_port)],
            engine_env(sv, EngineKnobs(2, "WARNING", {}), suffix="-unused", quotas=False),
            sv.log_dir,
        )
        fake.start()
        try:
            for name, (body, extra) in phases.items():
                if args.only and name not in args.only.split(","):
                    continue
                rows[name] = await phase(name, args, sv, body, extra)
                progress(f"{name}: {json.dumps(rows[name])}")
        finally:
            fake.stop()
    out: dict[str, Any] = {"model": MODEL, "jobs": args.jobs, "phases": rows}
    if "standard" in rows:
        out["over_standard"] = ratios(rows)
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.tiers")
    p.add_argument("--jobs", type=int, default=20, help="jobs per phase, after a warm-up")
    p.add_argument("--tokens-in", type=int, default=1200, help="the mock's reported prompt tokens")
    p.add_argument("--tokens-out", type=int, default=400, help="the mock's reported answer tokens")
    p.add_argument("--window", type=float, default=2.0, help="AI_BATCH_WINDOW_S of the batch phase")
    p.add_argument("--poll", type=float, default=1.0, help="AI_BATCH_POLL_S of the batch phase")
    p.add_argument("--offpeak-price", type=float, default=0.5, help="the open window's price")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a phase may take")
    p.add_argument("--only", default="", help="comma-separated phases (default: all four)")
    args = p.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
