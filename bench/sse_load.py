"""`python -m bench.sse_load [--streams 500] [--seconds 8] [--reps 2]`: what open job streams cost.

One API process (`bench.api_server`, the real app) on the embedded PostgreSQL and Temporal.
`GET /api/ai/jobs/{id}` is driven closed-loop (`bench.loadgen`, 32 connections) without streams,
then while a separate holder process keeps `--streams` server-sent event streams open
(`GET /api/ai/jobs/{id}/events`, one per seeded job) and `--notify-rate` notifications per
second wake some of them (each wake-up re-reads its job and sends nothing: the state is
unchanged), then without them again. Prints one JSON object: latency and throughput of each
phase and the ratio `with / without` (throughput: lower is slower).

The holder (`--hold`) runs in its own process so that 500 streams do not share the load
generator's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from db.session import SessionMaker
    from jobs.service import JobService


async def hold(base_url: str, ids: list[str], token: str) -> None:
    """Opens one stream per job id; prints `ready <n>` once every stream got its first event."""
    first = 0
    ready = asyncio.Event()
    limits = httpx.Limits(max_connections=len(ids) + 10, max_keepalive_connections=0)
    timeout = httpx.Timeout(120.0, read=None)
    headers = {"Authorization": f"Bearer {token}"}

    async def one(c: httpx.AsyncClient, job_id: str) -> None:
        nonlocal first
        async with c.stream("GET", f"/api/ai/jobs/{job_id}/events", headers=headers) as r:
            got = False
            async for line in r.aiter_lines():
                if line.startswith("data:") and not got:
                    got = True
                    first += 1
                    if first == len(ids):
                        ready.set()

    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as c:
        tasks = [asyncio.create_task(one(c, i)) for i in ids]
        await ready.wait()
        print(f"ready {first}", flush=True)
        await asyncio.gather(*tasks)


@dataclass
class _Load:
    """The closed-loop GET load on the API server, with or without the holder's streams open."""

    args: argparse.Namespace
    base_url: str
    token: str
    ids: list[str]
    sm: SessionMaker
    api_pid: int

    async def measure(self, tag: str) -> dict[str, Any]:
        from bench.loadgen import Request, http_load
        from bench.procs import progress

        get_ids = self.ids[:32]

        def make(i: int) -> Request:
            return Request(
                "GET",
                f"/api/ai/jobs/{get_ids[i % len(get_ids)]}",
                {"Authorization": f"Bearer {self.token}"},
            )

        await http_load(self.base_url, make, seconds=2, connections=32)  # warm-up
        res = await http_load(
            self.base_url, make, seconds=self.args.seconds, connections=32, server_pid=self.api_pid
        )
        progress(f"{tag}: {res['req_per_s']:.0f} req/s, p50 {res.get('p50_ms')} ms")
        return res

    async def notifier(self, stop: asyncio.Event) -> None:
        if self.args.notify_rate <= 0:
            return
        async with self.sm() as s:
            from sqlalchemy import text

            n = 0
            while not stop.is_set():
                await s.execute(
                    text("SELECT pg_notify('ai_job_changed', :id)"),
                    {"id": self.ids[n % len(self.ids)]},
                )
                await s.commit()
                n += 1
                await asyncio.sleep(1 / self.args.notify_rate)

    async def with_streams(self, rep: int) -> dict[str, Any]:
        """One measurement while a holder process keeps a stream per seeded job open."""
        from bench.procs import progress

        holder = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.sse_load",
            "--hold",
            self.base_url,
            "--token",
            self.token,
            *self.ids,
            stdout=asyncio.subprocess.PIPE,
        )
        assert holder.stdout is not None
        t0 = time.perf_counter()
        line = await asyncio.wait_for(holder.stdout.readline(), 120)
        progress(f"holder: {line.decode().strip()} after {time.perf_counter() - t0:.1f}s")
        stop = asyncio.Event()
        notify_task = asyncio.create_task(self.notifier(stop))
        res = await self.measure(f"rep {rep + 1} with {self.args.streams} streams")
        stop.set()
        await notify_task
        holder.terminate()
        await holder.wait()
        return res


async def _seed(svc: JobService, user: str, streams: int) -> list[str]:
    """One synthetic job per stream, all the one user's."""
    from jobs.service import CreateJobRequest

    ids = []
    for k in range(streams):
        r = await svc.create(
            CreateJobRequest(
                user_id=user,
                job_type="synthetic",
                target_type="bench",
                target_id=f"t{k}",
                input={},
            )
        )
        ids.append(str(r.job.id))
    return ids


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from api.auth import issue_token
    from bench.infra import BENCH_JWT_SECRET, EngineKnobs, engine_env, servers
    from bench.procs import Proc
    from db.session import make_engine, make_sessionmaker
    from jobs.service import JobService
    from jobs.types import default_catalog
    from runtime.embedded import free_port
    from runtime.wiring import create_policy

    out: dict[str, Any] = {"streams": args.streams, "seconds": args.seconds, "reps": args.reps}
    with servers(keep=False) as sv:
        knobs = EngineKnobs(interactive_concurrency=8, log_level="WARNING", extra_env={})
        env = engine_env(sv, knobs, suffix=f"-benchsse{uuid.uuid4().hex[:8]}", quotas=False)
        env["DB_POOL_SIZE"] = "20"
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        api = Proc(
            "api",
            [sys.executable, "-m", "bench.api_server", "--host", "127.0.0.1", "--port", str(port)],
            env,
            sv.log_dir,
        )
        api.start()
        user = "bench-sse"
        token = issue_token(BENCH_JWT_SECRET, user)
        from engine.settings import Settings

        settings = Settings.model_validate({**env})
        engine = make_engine(sv.database_url)
        sm = make_sessionmaker(engine)
        svc = JobService(sm, default_catalog(), create_policy(settings))
        ids = await _seed(svc, user, args.streams)
        await _wait_healthy(base_url)
        load = _Load(args, base_url, token, ids, sm, api.pid)
        without: list[dict[str, Any]] = []
        with_streams: list[dict[str, Any]] = []
        for rep in range(args.reps):
            without.append(await load.measure(f"rep {rep + 1} without streams"))
            with_streams.append(await load.with_streams(rep))
        without.append(await load.measure("without streams (after)"))
        api.stop()
        await engine.dispose()
    _summarize(out, without, with_streams)
    out["notify_rate"] = args.notify_rate
    return out


async def _wait_healthy(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url) as c:
        for _ in range(200):
            with contextlib.suppress(httpx.HTTPError):
                if (await c.get("/healthz")).status_code == 200:
                    break
            await asyncio.sleep(0.1)


def _summarize(
    out: dict[str, Any], without: list[dict[str, Any]], with_streams: list[dict[str, Any]]
) -> None:
    def med(runs: list[dict[str, Any]], key: str) -> float:
        vals = sorted(float(r[key]) for r in runs if r.get(key) is not None)
        return vals[len(vals) // 2] if vals else float("nan")

    for name, runs in (("without", without), ("with", with_streams)):
        out[name] = {
            "req_per_s": med(runs, "req_per_s"),
            "p50_ms": med(runs, "p50_ms"),
            "p99_ms": med(runs, "p99_ms"),
            "server_cpu_pct": med(runs, "server_cpu_pct"),
            "runs": runs,
        }
    out["throughput_ratio"] = out["with"]["req_per_s"] / out["without"]["req_per_s"]
    out["p50_ratio"] = out["with"]["p50_ms"] / out["without"]["p50_ms"]


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.sse_load")
    p.add_argument("--streams", type=int, default=500)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--notify-rate", type=float, default=20.0, help="notifications per second")
    p.add_argument("--hold", metavar="BASE_URL", help=argparse.SUPPRESS)
    p.add_argument("--token", help=argparse.SUPPRESS)
    p.add_argument("ids", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.hold:
        asyncio.run(hold(args.hold, args.ids, args.token))
        return
    result = asyncio.run(run(args))
    for k in ("with", "without"):
        for r in result[k].pop("runs"):
            r.pop("status_codes", None)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
