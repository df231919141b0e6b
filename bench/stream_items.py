"""`python -m bench.stream_items`: items while the model is still writing
(docs/benchmarks.md, "Streamed items: latency and CPU").

The real stack as processes (as `bench.long_source`): an embedded PostgreSQL and a headless
Temporal dev server, the API (`bench.api_server`), `aijobs relay` and one `aijobs worker
--queue ai-interactive`, and as the provider the test suite's OpenAI-compatible mock
(`tests/fakes/openai_server.py`, its own process), which streams a `--items`-question quiz
answer in pieces of `--piece` characters, `--gap` seconds apart, and records when it handed
each piece to the server.

Two phases, the same jobs one at a time (after a warm-up each), in one run:

- streamed: the engine as shipped; the client follows each job's event stream and notes when
  each `item` event arrives. An item's latency is that moment minus the moment the mock handed
  over the piece holding the item's last byte (same machine, one clock: epoch seconds);
- whole: the same stack with AI_STREAM_DISABLED_MODELS=* (no item is streamed), the mock
  answering after the time the streamed answer took, as one JSON body.

Per phase the worker's and the API's CPU seconds per job (`/proc/<pid>/stat`), and the engine
database's committed transactions per job (`pg_stat_database.xact_commit`, read after the
statistics settle); the figures of merit are p50/p99 item latency and streamed/whole CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from typing import Any

import httpx

from bench.infra import BENCH_JWT_SECRET, Admin, EngineKnobs, EngineStack, Servers, engine_env
from bench.procs import Proc, process_cpu_s, progress
from bench.stats import median

FAKE_KEY = "sk-bench-fake-provider-key"
SOURCE = "Enzymes are catalysts. They speed reactions up. Temperature changes their shape."


def answer(tag: str, count: int) -> dict[str, Any]:
    return {
        "questions": [
            {
                "question": f"Question {tag}-{i}: what does catalyst {i} change in the cell?",
                "choices": [f"rate {i}", f"shape {i}", f"size {i}", f"colour {i}"],
                "answer_index": i % 4,
                "explanation": f"Because {tag} {i} explains how catalysts speed reactions up.",
            }
            for i in range(count)
        ]
    }


def item_ends(content: dict[str, Any]) -> list[int]:
    """The offset just past each question's last byte in the mock's serialisation."""
    text = json.dumps(content)
    ends, depth, start = [], 0, text.index("[")
    for i in range(start + 1, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                ends.append(i + 1)
    return ends


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


async def follow(http: httpx.AsyncClient, token: str, count: int) -> dict[str, Any]:
    """Create a quiz and follow its stream to its end: each item event's arrival (epoch)."""
    headers = {"Authorization": f"Bearer {token}"}
    body = {
        "jobType": "quiz_generation",
        "targetType": "bench",
        "targetId": f"t-{uuid.uuid4().hex[:8]}",
        "input": {"sourceText": SOURCE, "count": count},
    }
    r = await http.post("/api/ai/jobs", json=body, headers=headers)
    assert r.status_code == 202, r.text
    job_id = r.json()["jobId"]
    arrivals: dict[int, float] = {}
    status: dict[str, Any] = {}
    fields: dict[str, str] = {}
    async with http.stream("GET", f"/api/ai/jobs/{job_id}/events", headers=headers) as s:
        async for line in s.aiter_lines():
            if line:
                if not line.startswith(":"):
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")
                continue
            now = time.time()
            if "data" in fields and fields.get("event") == "item":
                arrivals.setdefault(int(json.loads(fields["data"])["ordinal"]), now)
            elif "data" in fields:
                status = json.loads(fields["data"])
            fields = {}
    if status.get("lifecycleStatus") != "succeeded":
        raise RuntimeError(f"job {job_id} ended {status.get('lifecycleStatus')}")
    return {"job_id": job_id, "arrivals": arrivals}


async def script(http: httpx.AsyncClient, root: str, step: dict[str, Any]) -> None:
    r = await http.post(f"{root}/_reset")
    r.raise_for_status()
    r = await http.post(f"{root}/_script", json={"steps": [], "default": step, "rules": []})
    r.raise_for_status()


async def phase(
    name: str, args: argparse.Namespace, sv: Servers, step: dict[str, Any], extra: dict[str, str]
) -> dict[str, Any]:
    """One stack (worker, relay, API) with `extra` settings: a warm-up, then `--jobs` jobs."""
    from temporalio.client import Client

    from api.auth import issue_token
    from runtime.embedded import free_port

    fake_root = f"http://127.0.0.1:{args.fake_port}"
    knobs = EngineKnobs(
        interactive_concurrency=2,
        log_level="WARNING",
        extra_env={
            "AI_BASE_URL": f"{fake_root}/v1",
            "DEEPSEEK_API_KEY": FAKE_KEY,
            "AI_MODEL": "deepseek-chat",
            **extra,
        },
    )
    stack = EngineStack(name, sv, knobs, workers=1)
    api_port = free_port()
    py = sys.executable
    api = Proc(
        f"{name}-api",
        [py, "-m", "bench.api_server", "--host", "127.0.0.1", "--port", str(api_port)],
        engine_env(sv, knobs, suffix=stack.suffix, quotas=False),
        sv.log_dir,
    )
    api.start()
    client = await Client.connect(sv.temporal_address, namespace="default")
    admin = Admin(sv.admin_uri)
    await admin.open()
    out: dict[str, Any] = {"phase": name}
    try:
        await stack.start(client, admin)
        token = issue_token(BENCH_JWT_SECRET, f"bench-{name}")
        base = f"http://127.0.0.1:{api_port}"
        async with httpx.AsyncClient(base_url=base, timeout=600, trust_env=False) as http:
            await _wait_ready(http)
            await script(http, fake_root, step)
            await follow(http, token, args.items)  # warm-up: imports, pools, caches
            await admin.wait_quiet()
            commits = await admin.xact_commit()
            worker, api_cpu = process_cpu_s(stack.workers[0].pid), process_cpu_s(api.pid)
            t0 = time.perf_counter()
            runs = [await follow(http, token, args.items) for _ in range(args.jobs)]
            wall = time.perf_counter() - t0
            worker = process_cpu_s(stack.workers[0].pid) - worker
            api_cpu = process_cpu_s(api.pid) - api_cpu
            await admin.wait_quiet()
            commits = await admin.xact_commit() - commits
            pieces = (await http.get(f"{fake_root}/_streams")).json()["pieces"]
    finally:
        await admin.close()
        stack.stop()
        api.stop()
    n = args.jobs
    out.update(
        jobs=n,
        wall_s_per_job=round(wall / n, 3),
        worker_cpu_ms_per_job=round(worker * 1000 / n, 1),
        api_cpu_ms_per_job=round(api_cpu * 1000 / n, 1),
        commits_per_job=round(commits / n, 1),
        items_per_job=round(sum(len(r["arrivals"]) for r in runs) / n, 1),
    )
    if pieces:
        out["latency_ms"] = _latencies(runs, pieces[1:], step)  # [0] was the warm-up's
    return out


def _latencies(
    runs: list[dict[str, Any]], pieces: list[list[list[float]]], step: dict[str, Any]
) -> list[float]:
    """Per item: its event's arrival minus the hand-over of the piece holding its last byte."""
    ends = item_ends(step["content"])
    out: list[float] = []
    for run, sent in zip(runs, pieces, strict=True):
        for ordinal, arrived in run["arrivals"].items():
            end = ends[ordinal]
            written = next(at for stop, at in sent if stop >= end)
            out.append(round((arrived - written) * 1000, 1))
    return out


async def _wait_ready(http: httpx.AsyncClient) -> None:
    for _ in range(300):
        try:
            if (await http.get("/healthz")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.1)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.infra import servers
    from runtime.embedded import free_port

    content = answer("s", args.items)
    pieces = -(-len(json.dumps(content)) // args.piece)
    streamed = {
        "kind": "valid",
        "content": content,
        "chunk_chars": args.piece,
        "chunk_delay_s": args.gap,
        "tokens_in": 300,
        "tokens_out": len(json.dumps(content)) // 4,
    }
    whole = {"kind": "slow", "delay_s": pieces * args.gap, "content": content}
    out: dict[str, Any] = {
        "items": args.items,
        "piece_chars": args.piece,
        "gap_s": args.gap,
        "pieces": pieces,
    }
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
            s = await phase("streamed", args, sv, streamed, {})
            progress(f"streamed: {json.dumps({k: v for k, v in s.items() if k != 'latency_ms'})}")
            w = await phase("whole", args, sv, whole, {"AI_STREAM_DISABLED_MODELS": "*"})
            progress(f"whole: {json.dumps(w)}")
        finally:
            fake.stop()
    lat = s.pop("latency_ms", [])
    out["streamed"], out["whole"] = s, w
    if lat:
        out["latency_p50_ms"] = round(percentile(lat, 0.5), 1)
        out["latency_p99_ms"] = round(percentile(lat, 0.99), 1)
        out["latency_max_ms"] = max(lat)
        out["latency_median_ms"] = round(median(lat), 1)
        out["latency_samples"] = len(lat)
    out["worker_cpu_streamed_over_whole"] = round(
        s["worker_cpu_ms_per_job"] / max(w["worker_cpu_ms_per_job"], 0.1), 2
    )
    out["api_cpu_streamed_over_whole"] = round(
        s["api_cpu_ms_per_job"] / max(w["api_cpu_ms_per_job"], 0.1), 2
    )
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.stream_items")
    p.add_argument("--items", type=int, default=20, help="questions in each answer (at most 20)")
    p.add_argument("--piece", type=int, default=12, help="characters per streamed piece")
    p.add_argument("--gap", type=float, default=0.02, help="seconds between pieces")
    p.add_argument("--jobs", type=int, default=6, help="jobs per phase, after a warm-up")
    args = p.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
