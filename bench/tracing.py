"""The tracing figure (`--only tracing`): what tracing costs the engine per job, off, sampled
at 10 % and at 100 %, with the export real.

Each mode runs its own engine stack (relay + one worker; one stack at a time, since two relays
would share the outbox), its order rotating per repetition, with the environment production
would set:

- **off**: no `OTEL_*` variable (no tracer provider, no interceptor);
- **10 %**: `OTEL_EXPORTER_OTLP_ENDPOINT` at a local sink (`bench/otlp_sink.py`, a process of
  its own that decodes and drops), `OTEL_TRACES_SAMPLER=parentbased_traceidratio`,
  `OTEL_TRACES_SAMPLER_ARG=0.1`: the relay's `StartWorkflow` span is the root (the bench creates
  jobs outside any request, so no API span is the parent), and the worker follows its decision;
- **100 %**: the same with `OTEL_TRACES_SAMPLER_ARG=1.0`.

Per mode and repetition: a warm-up, a wait of the batch processor's schedule delay so the
warm-up's spans are exported, an idle probe of the worker's and relay's CPU rate, then N
synthetic jobs created through `JobService.create` and polled in SQL until all succeeded (as
figure 1), then another wait for the run's last batch to reach the sink. CPU per job is
utime + stime of the worker (and the relay) over the run and that wait, minus the idle rate over
the wait. Spans per job are the sink's count over the same window: the proof that the sampler
kept what it was asked to.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from bench.infra import EngineKnobs, EngineStack, Servers
from bench.procs import Proc, child_env, process_cpu_s, progress, tree_cpu_s
from bench.report import Results
from bench.stats import median, ratio

# The batch span processor exports every OTEL_BSP_SCHEDULE_DELAY (5 s by default); the waits
# before the idle probe and after a run are one delay plus a margin, in every mode alike.
EXPORT_WAIT_S = 6.0
IDLE_PROBE_S = 3.0
TARGET = 1.1  # worker CPU per job at 10 % ÷ off

MODES: tuple[tuple[str, dict[str, str]], ...] = (
    ("off", {}),
    (
        "ratio_0.1",
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"},
    ),
    (
        "ratio_1",
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.0"},
    ),
)
LABELS = {"off": "off", "ratio_0.1": "10 %", "ratio_1": "100 %"}


def sink_counts(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=5) as r:
        out: dict[str, int] = json.loads(r.read())
    return out


async def wait_sink(port: int, proc: Proc, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if not proc.alive():
            raise RuntimeError(f"OTLP sink exited; log tail:\n{proc.tail()}")
        with contextlib.suppress(OSError):
            sink_counts(port)
            return
        if time.monotonic() > deadline:
            raise TimeoutError("OTLP sink not answering")
        await asyncio.sleep(0.1)


async def phase_tracing(
    ctx: Any, args: argparse.Namespace, sv: Servers, knobs: EngineKnobs, res: Results
) -> None:
    from runtime.embedded import free_port

    f = res.fig("tracing")
    if args.quick and args.only is None:
        # Three stacks started and stopped per repetition: longer than the rest of --quick.
        f["skipped"] = "--quick (run it with --only tracing)"
        progress("tracing: skipped in --quick (use --only tracing)")
        return
    port = free_port()
    sink = Proc(
        "otlp-sink",
        [sys.executable, "-m", "bench.otlp_sink", "--port", str(port)],
        child_env({}),
        sv.log_dir,
    )
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m, _ in MODES}
    try:
        sink.start()
        await wait_sink(port, sink)
        for r in range(args.reps):
            for k in range(len(MODES)):
                mode, extra = MODES[(r + k) % len(MODES)]
                env = dict(knobs.extra_env)
                if mode != "off":
                    env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", **extra}
                stack = EngineStack(
                    f"trace-{mode}-r{r}", sv, dataclasses.replace(knobs, extra_env=env), workers=1
                )
                try:
                    await stack.start(ctx.client, ctx.admin)
                    ctx.watch = [*stack.procs, sink]
                    run = await _one_mode(ctx, args, sv, stack, port)
                finally:
                    ctx.watch = []
                    stack.stop()
                    res.record_procs(stack.procs)
                run["mode"] = mode
                runs[mode].append(run)
                progress(
                    f"tracing rep {r + 1}/{args.reps} {LABELS[mode]:>5}: "
                    f"{run['jobs_per_s']:.1f} jobs/s, worker "
                    f"{1e3 * run['cpu_s_per_job']['worker']:.2f} ms/job, relay "
                    f"{1e3 * run['cpu_s_per_job']['relay']:.2f} ms/job, "
                    f"{run['spans_per_job']:.2f} spans/job"
                )
    finally:
        sink.stop()
    f["sampler"] = "parentbased_traceidratio (OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG)"
    f["export"] = "OTLP/HTTP protobuf to a local sink process (decodes, counts, drops)"
    for mode, _ in MODES:
        rr = runs[mode]
        f[mode] = {
            "reps": rr,
            "median_jobs_per_s": median([x["jobs_per_s"] for x in rr]),
            "median_worker_cpu_ms_per_job": median(
                [1e3 * x["cpu_s_per_job"]["worker"] for x in rr]
            ),
            "median_relay_cpu_ms_per_job": median([1e3 * x["cpu_s_per_job"]["relay"] for x in rr]),
            "median_spans_per_job": median([x["spans_per_job"] for x in rr]),
        }
    off = f["off"]["median_worker_cpu_ms_per_job"]
    for mode in ("ratio_0.1", "ratio_1"):
        f[mode]["worker_cpu_ratio"] = ratio(f[mode]["median_worker_cpu_ms_per_job"], off)
        # Each repetition's own ratio: the modes of one repetition run minutes apart at most.
        f[mode]["worker_cpu_ratio_per_rep_median"] = median(
            [
                ratio(1e3 * x["cpu_s_per_job"]["worker"], 1e3 * o["cpu_s_per_job"]["worker"])
                for x, o in zip(runs[mode], runs["off"], strict=True)
            ]
        )
        f[mode]["jobs_per_s_ratio"] = ratio(
            f[mode]["median_jobs_per_s"], f["off"]["median_jobs_per_s"]
        )
    f["target"] = f"10 % worker CPU/job <= {TARGET} x off"
    f["met"] = f["ratio_0.1"]["worker_cpu_ratio"] <= TARGET


async def _one_mode(
    ctx: Any,
    args: argparse.Namespace,
    sv: Servers,
    stack: EngineStack,
    port: int,
) -> dict[str, Any]:
    from bench.figures import engine_throughput

    meter: dict[str, Callable[[], float]] = {
        "worker": lambda: sum(process_cpu_s(p.pid) for p in stack.workers),
        "relay": lambda: process_cpu_s(stack.relay.pid),
        "temporal": lambda: process_cpu_s(sv.temporal.process.pid),
        "postgres": lambda: tree_cpu_s(sv.pg.pid),
    }

    def read() -> dict[str, float]:
        return {k: fn() for k, fn in meter.items()}

    n = args.jobs
    await engine_throughput(ctx, args.warmup_jobs, "twarm")
    await asyncio.sleep(EXPORT_WAIT_S)  # the warm-up's last batch leaves before the probe
    c0, t0 = read(), time.perf_counter()
    await asyncio.sleep(IDLE_PROBE_S)
    c1, t1 = read(), time.perf_counter()
    idle = {k: (c1[k] - c0[k]) / (t1 - t0) for k in meter}
    s0 = sink_counts(port)
    c0, t0 = read(), time.perf_counter()
    e: dict[str, Any] = await engine_throughput(ctx, n, "trace")
    await asyncio.sleep(EXPORT_WAIT_S)
    c1, t1 = read(), time.perf_counter()
    s1 = sink_counts(port)
    waited = (t1 - t0) - e["elapsed_s"]
    e["cpu_s"] = {k: c1[k] - c0[k] - idle[k] * waited for k in meter}
    e["cpu_s_per_job"] = {k: v / n for k, v in e["cpu_s"].items()}
    e["idle_cpu_per_s"] = idle
    e["sink"] = {k: s1[k] - s0[k] for k in s0}
    e["spans_per_job"] = e["sink"]["spans"] / n
    return e


def render(fig: dict[str, Any]) -> list[tuple[str, ...]]:
    """Table rows (number, figure, engine, baseline, ratio, target, met) of the tracing figure."""
    if "skipped" in fig:
        return [("9", "Tracing: worker CPU/job, 10 % sampled ÷ off", f"skipped ({fig['skipped']})")]
    if "off" not in fig:
        return []
    off = fig["off"]
    rows: list[tuple[str, ...]] = []
    for mode, target in (("ratio_0.1", f"≤ {TARGET}"), ("ratio_1", "—")):
        m = fig[mode]
        rows.append(
            (
                "9",
                f"Tracing sampled at {LABELS[mode]} (parentbased_traceidratio, OTLP/HTTP to a "
                "local sink): worker CPU ms/job (relay; spans/job; jobs/s)",
                f"{m['median_worker_cpu_ms_per_job']:.2f} (relay "
                f"{m['median_relay_cpu_ms_per_job']:.2f}; {m['median_spans_per_job']:.2f} spans; "
                f"{m['median_jobs_per_s']:.1f} jobs/s)",
                f"{off['median_worker_cpu_ms_per_job']:.2f} (off; relay "
                f"{off['median_relay_cpu_ms_per_job']:.2f}; {off['median_jobs_per_s']:.1f} jobs/s)",
                f"{m['worker_cpu_ratio']:.2f} (per rep {m['worker_cpu_ratio_per_rep_median']:.2f};"
                f" jobs/s {m['jobs_per_s_ratio']:.2f})",
                target,
                ("yes" if fig["met"] else "**no**") if mode == "ratio_0.1" else "—",
            )
        )
    return rows
