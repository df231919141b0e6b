"""`python -m bench.long_source`: what a client waits for over a long source
(docs/benchmarks.md, "Long sources: time to first item").

The real stack as processes: an embedded PostgreSQL and a headless Temporal dev server
(`bench.infra.servers`), the API (`bench.api_server`, the real app), `aijobs relay` and one
`aijobs worker --queue ai-interactive` (`bench.infra.EngineStack`), and as the provider the
OpenAI-compatible mock of the test suite (`tests/fakes/openai_server.py`, its own process),
scripted so that every call answers after `--delay` seconds with questions of its own.

Per repetition:

- one call: a quiz over a short source (one prompt, one call): created over HTTP, its stream
  followed until `succeeded`; its wall time is "one chunk's time" (the provider's delay plus the
  engine's per-job work);
- long: a quiz over a `--chars`-character source (default 200,000), `count` 20: created over
  HTTP, its event stream followed from just after the create's answer: time to the first `item`
  event, to the last one, and to the terminal `status` event, all from before the POST.

The figure of merit: the long job's total time against one call x chunks / slots, where slots
is min(AI_CHUNK_CONCURRENCY, AI_INTERACTIVE_CONCURRENCY): what a perfect fan-out would take.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
import uuid
from typing import Any

import httpx

from bench.infra import (
    BENCH_JWT_SECRET,
    Admin,
    EngineKnobs,
    EngineStack,
    Servers,
    engine_env,
    servers,
)
from bench.procs import Proc, progress
from bench.stats import median

FAKE_KEY = "sk-bench-fake-provider-key"


def long_source(chars: int) -> str:
    """Distinct sentences (each names its number), so the source never repeats itself."""
    parts: list[str] = []
    size, i = 0, 0
    while size < chars:
        p = (
            f"Paragraph {i} explains that enzyme catalysts{i} accelerate reactions{i} inside "
            f"cells. Researchers measured temperature{i} effects on molecules{i} carefully. "
            f"Observation{i} shows membranes{i} transport nutrients efficiently.\n\n"
        )
        parts.append(p)
        size += len(p)
        i += 1
    return "".join(parts)[:chars]


def answer(tag: str, count: int = 6) -> dict[str, Any]:
    return {
        "questions": [
            {
                "question": f"Question {tag}-{i}?",
                "choices": [f"a{i}", f"b{i}", f"c{i}", f"d{i}"],
                "answer_index": i % 4,
                "explanation": f"Because {tag} {i}.",
            }
            for i in range(count)
        ]
    }


async def script_provider(http: httpx.AsyncClient, root: str, delay_s: float) -> None:
    steps = [{"kind": "slow", "delay_s": delay_s, "content": answer(f"c{n}")} for n in range(400)]
    default = {"kind": "slow", "delay_s": delay_s, "content": answer("d")}
    r = await http.post(f"{root}/_script", json={"steps": steps, "default": default, "rules": []})
    r.raise_for_status()


async def follow(
    http: httpx.AsyncClient, token: str, source: str, count: int
) -> tuple[dict[str, Any], float]:
    """Create a quiz and follow its stream: timings in seconds from before the POST."""
    headers = {"Authorization": f"Bearer {token}"}
    body = {
        "jobType": "quiz_generation",
        "targetType": "bench",
        "targetId": f"t-{uuid.uuid4().hex[:8]}",
        "input": {"sourceText": source, "count": count},
    }
    t0 = time.perf_counter()
    r = await http.post("/api/ai/jobs", json=body, headers=headers)
    assert r.status_code == 202, r.text
    job_id = r.json()["jobId"]
    first = last = None
    items = 0
    chunks: set[int] = set()
    status: dict[str, Any] = {}
    fields: dict[str, str] = {}
    async with http.stream("GET", f"/api/ai/jobs/{job_id}/events", headers=headers) as s:
        async for line in s.aiter_lines():
            if line:
                if not line.startswith(":"):
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")
                continue
            now = time.perf_counter() - t0
            if "data" in fields and fields.get("event") == "item":
                items += 1
                chunks.add(int(json.loads(fields["data"])["chunk"]))
                first = now if first is None else first
                last = now
            elif "data" in fields:
                status = json.loads(fields["data"])
            fields = {}
    total = time.perf_counter() - t0
    if status.get("lifecycleStatus") != "succeeded":
        raise RuntimeError(f"job {job_id} ended {status.get('lifecycleStatus')}")
    return {
        "job_id": job_id,
        "first_item_s": first,
        "last_item_s": last,
        "total_s": total,
        "items": items,
        "chunks_streamed": len(chunks),
        "artifacts": status["result"]["artifactCount"],
    }, total


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from temporalio.client import Client

    from api.auth import issue_token
    from runtime.embedded import free_port

    out: dict[str, Any] = {
        "chars": args.chars,
        "delay_s": args.delay,
        "chunk_input_tokens": args.chunk_tokens,
        "chunk_concurrency": args.window,
        "worker_slots": args.slots,
        "reps": args.reps,
        "runs": [],
    }
    with servers(keep=False) as sv:
        fake_port, api_port = free_port(), free_port()
        fake_root = f"http://127.0.0.1:{fake_port}"
        knobs = _knobs(args, fake_root)
        py = sys.executable
        fake = Proc(
            "fake-provider",
            [py, "-m", "tests.fakes.openai_server", "--port", str(fake_port)],
            engine_env(sv, knobs, suffix="-unused", quotas=False),
            sv.log_dir,
        )
        fake.start()
        stack = EngineStack("long", sv, knobs, workers=1)
        api = Proc(
            "api",
            [py, "-m", "bench.api_server", "--host", "127.0.0.1", "--port", str(api_port)],
            engine_env(sv, knobs, suffix=stack.suffix, quotas=False),
            sv.log_dir,
        )
        api.start()
        client = await Client.connect(sv.temporal_address, namespace="default")
        admin = Admin(sv.admin_uri)
        await admin.open()
        try:
            await stack.start(client, admin)
            token = issue_token(BENCH_JWT_SECRET, "bench-long")
            base = f"http://127.0.0.1:{api_port}"
            async with httpx.AsyncClient(base_url=base, timeout=600, trust_env=False) as http:
                await _wait_ready(http, fake_root)
                await script_provider(http, fake_root, args.delay)
                await _reps(args, sv, http, token, out["runs"])
        finally:
            await admin.close()
            stack.stop()
            api.stop()
            fake.stop()
    runs = out["runs"]
    for key in ("one_call_s", "first_item_s", "last_item_s", "total_s", "ideal_s", "waves_s"):
        out[f"median_{key}"] = round(median([float(r[key]) for r in runs]), 3)
    out["median_total_over_ideal"] = round(out["median_total_s"] / out["median_ideal_s"], 2)
    return out


def _knobs(args: argparse.Namespace, fake_root: str) -> EngineKnobs:
    """The engine's processes against the fake provider, with the run's chunking knobs."""
    return EngineKnobs(
        interactive_concurrency=args.slots,
        log_level="WARNING",
        extra_env={
            "AI_BASE_URL": f"{fake_root}/v1",
            "DEEPSEEK_API_KEY": FAKE_KEY,
            "AI_MODEL": "deepseek-chat",
            "AI_CHUNK_INPUT_TOKENS": str(args.chunk_tokens),
            "AI_CHUNK_CONCURRENCY": str(args.window),
        },
    )


async def _wait_ready(http: httpx.AsyncClient, fake_root: str) -> None:
    """Until the API and the fake provider both answer (30 s at most, then the run goes on)."""
    for _ in range(300):
        try:
            ok = (await http.get("/healthz")).status_code == 200
            ok = ok and (await http.get(f"{fake_root}/_calls")).status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok:
            break
        await asyncio.sleep(0.1)


async def _reps(
    args: argparse.Namespace,
    sv: Servers,
    http: httpx.AsyncClient,
    token: str,
    runs: list[dict[str, Any]],
) -> None:
    """A warm-up, then per repetition a short job (one call) and the long source's job."""
    source = long_source(args.chars)
    short = long_source(2_000)
    await follow(http, token, short, 5)  # warm-up: imports, pools, workflow cache
    for rep in range(args.reps):
        one, _ = await follow(http, token, short, 5)
        long, _ = await follow(http, token, source, 20)
        row = await admin_chunks(sv, long["job_id"])
        long["chunks"] = row
        slots = min(args.window, args.slots)
        long["ideal_s"] = one["total_s"] * row / slots
        long["waves_s"] = one["total_s"] * math.ceil(row / slots)
        runs.append({"one_call_s": one["total_s"], **long})
        progress(
            f"rep {rep + 1}: {row} chunks, first item {long['first_item_s']:.2f}s, "
            f"last {long['last_item_s']:.2f}s, total {long['total_s']:.2f}s, one "
            f"call {one['total_s']:.2f}s"
        )


async def admin_chunks(sv: Any, job_id: str) -> int:
    import psycopg

    async with await psycopg.AsyncConnection.connect(sv.database_url, autocommit=True) as c:
        cur = await c.execute("SELECT chunk_count FROM ai_job WHERE id = %s", (job_id,))
        row = await cur.fetchone()
    assert row is not None and row[0] is not None, "the long source was not chunked"
    return int(row[0])


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.long_source")
    p.add_argument("--chars", type=int, default=200_000, help="the long source's length")
    p.add_argument("--delay", type=float, default=2.0, help="seconds each provider call takes")
    p.add_argument("--chunk-tokens", type=int, default=16_000, help="AI_CHUNK_INPUT_TOKENS")
    p.add_argument("--window", type=int, default=4, help="AI_CHUNK_CONCURRENCY")
    p.add_argument("--slots", type=int, default=4, help="AI_INTERACTIVE_CONCURRENCY")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
