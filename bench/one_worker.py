"""Phase A of `python -m bench`: the bare baseline workers (one-activity and five-stage
shape) beside an engine stack with ONE worker, for throughput (1, and commits for 5), relay
latency (3, interleaved with direct starts) and latency at a fixed load (2).

Every process the phase starts is stopped in its `finally`, and a failing figure is recorded
while the phase goes on with the next one (`guarded`).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from typing import Any

from bench.infra import EngineKnobs, EngineStack, Servers, wait_pollers
from bench.procs import Proc, child_env, progress, stop_group
from bench.report import Results, guarded
from bench.stats import median, ratio
from bench.throughput import fig_throughput, throughput_cpu_meter


def baseline_worker(
    args: argparse.Namespace, sv: Servers, queue: str, *, shape: str = "one"
) -> Proc:
    """`shape` "one": the one-activity bare workflow; "five": the engine's stage shape."""
    return Proc(
        "baseline-worker" if shape == "one" else "shape-worker",
        [
            sys.executable,
            "-m",
            "bench.baseline",
            "worker",
            "--shape",
            shape,
            "--address",
            sv.temporal_address,
            "--task-queue",
            queue,
            "--max-concurrent-activities",
            str(args.interactive_concurrency),
            "--max-concurrent-local-activities",
            "200",
            "--max-concurrent-workflow-tasks",
            "100",
        ],
        child_env({}),
        sv.log_dir,
    )


async def phase_one_worker(
    ctx: Any, args: argparse.Namespace, sv: Servers, knobs: EngineKnobs, res: Results
) -> None:
    base_q = f"bench-baseline-{uuid.uuid4().hex[:8]}"
    shape_q = f"bench-shape-{uuid.uuid4().hex[:8]}"
    baseline = baseline_worker(args, sv, base_q)
    bare = [baseline]
    if "throughput" in args.want:
        bare.append(baseline_worker(args, sv, shape_q, shape="five"))
    stack = EngineStack("engine1", sv, knobs, workers=1)
    try:
        for b in bare:
            b.start()
        await stack.start(ctx.client, ctx.admin)
        for b, q in zip(bare, (base_q, shape_q), strict=False):
            await wait_pollers(ctx.client, q, 1, time.monotonic() + 60, [b])
        ctx.watch = [*stack.procs, *bare]
        if "throughput" in args.want:
            queues = {"baseline": base_q, "shape": shape_q}
            meter = throughput_cpu_meter(sv, stack, baseline, bare[1])
            await guarded(res, "throughput", lambda: fig_throughput(ctx, args, queues, res, meter))
        if "relay" in args.want:
            await guarded(res, "relay", lambda: fig_relay(ctx, args, base_q, res))
        if "latency" in args.want:
            await guarded(res, "latency", lambda: fig_latency(ctx, args, res))
    finally:
        ctx.watch = []
        stop_group([*stack.procs, *bare])
        res.record_procs([*stack.procs, *bare])


# CPU seconds of each party to a throughput run, read from /proc/<pid>/stat.


async def fig_relay(ctx: Any, args: argparse.Namespace, base_q: str, res: Results) -> None:
    """One job at a time, then again while `--relay-background` other jobs run (a job's
    change or end must never hold another job's start back), each against direct starts
    measured the same way."""
    from bench.figures import direct_start_latency, relay_latency

    count, gap = args.relay_samples, args.relay_gap_ms / 1000
    warm = max(5, count // 5)
    progress(f"relay: warm-up ({warm} samples each)")
    await direct_start_latency(ctx, base_q, warm, gap)
    await relay_latency(ctx, warm, gap, "warm")
    f = res.fig("relay")
    variants = [("", 0)]
    if args.relay_background:
        variants.append(("loaded_", args.relay_background))
    for prefix, background in variants:
        relay_runs: list[dict[str, Any]] = []
        direct_runs: list[dict[str, Any]] = []
        for r in range(args.reps):
            d = await direct_start_latency(ctx, base_q, count, gap, background=background)
            e = await relay_latency(ctx, count, gap, f"{prefix}r{r}", background=background)
            progress(
                f"relay{f' with {background} jobs running' if background else ''} rep "
                f"{r + 1}/{args.reps}: commit->started p50 {e['p50_ms']:.1f} p99 "
                f"{e['p99_ms']:.1f} ms; direct start p50 {d['p50_ms']:.1f} p99 {d['p99_ms']:.1f}"
            )
            relay_runs.append(e)
            direct_runs.append(d)
        _relay_figure(f, prefix, relay_runs, direct_runs)
        f[f"{prefix}background"] = background


def _relay_figure(
    f: dict[str, Any],
    prefix: str,
    relay_runs: list[dict[str, Any]],
    direct_runs: list[dict[str, Any]],
) -> None:
    for key, runs in (("relay", relay_runs), ("direct", direct_runs)):
        f[f"{prefix}{key}"] = {
            "reps": runs,
            "median_p50_ms": median([x["p50_ms"] for x in runs]),
            "median_p99_ms": median([x["p99_ms"] for x in runs]),
        }
    rp50, rp99 = f[f"{prefix}relay"]["median_p50_ms"], f[f"{prefix}relay"]["median_p99_ms"]
    dp50, dp99 = f[f"{prefix}direct"]["median_p50_ms"], f[f"{prefix}direct"]["median_p99_ms"]
    f[f"{prefix}p50_ratio"], f[f"{prefix}p99_ratio"] = ratio(rp50, dp50), ratio(rp99, dp99)
    f[f"{prefix}p50_delta_ms"] = rp50 - dp50
    f[f"{prefix}p50_target"] = "<= direct p50 + 5 ms"
    f[f"{prefix}p99_target"] = "<= 2 x direct p99"
    f[f"{prefix}p50_met"], f[f"{prefix}p99_met"] = rp50 <= dp50 + 5.0, rp99 <= 2 * dp99


async def fig_latency(ctx: Any, args: argparse.Namespace, res: Results) -> None:
    from bench.figures import engine_latency

    warm_s = min(5.0, args.duration)
    progress(f"latency: warm-up ({args.rate:g} jobs/s for {warm_s:g}s)")
    await engine_latency(ctx, args.rate, warm_s, "warm")
    runs: list[dict[str, Any]] = []
    for r in range(args.reps):
        e = await engine_latency(ctx, args.rate, args.duration, f"r{r}")
        progress(
            f"latency rep {r + 1}/{args.reps}: p50 {e['p50_ms']:.1f} p95 {e['p95_ms']:.1f} "
            f"p99 {e['p99_ms']:.1f} ms"
        )
        runs.append(e)
    f = res.fig("latency")
    f["reps"] = runs
    for k in ("p50_ms", "p95_ms", "p99_ms"):
        f[f"median_{k}"] = median([x[k] for x in runs])
