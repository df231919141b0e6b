"""Figure 1 (end-to-end throughput against the bare workflows, and the CPU each party spends per
job) and the commits per job of figure 5, measured in the same runs.

The engine and the two bare sides run in turns that rotate with each repetition, so the drift of
a shared machine hits every side alike. The idle engine still commits and burns CPU (the relay
polls, timers fire): both rates are measured once after the warm-up and subtracted from each
engine run's settle time, so a figure counts the jobs' own work only.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bench.infra import EngineStack, Servers
from bench.procs import Proc, process_cpu_s, progress, tree_cpu_s
from bench.report import Results
from bench.stats import median, ratio

IDLE_PROBE_S = 6.0

# CPU seconds of each party to a throughput run, read from /proc/<pid>/stat.
CpuMeter = dict[str, Callable[[], float]]
ENGINE_OWN_CPU = ("engine_worker", "relay")
SERVER_CPU = ("temporal", "postgres")


def throughput_cpu_meter(sv: Servers, stack: EngineStack, baseline: Proc, shape: Proc) -> CpuMeter:
    def own() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    return {
        "engine_worker": lambda: sum(process_cpu_s(p.pid) for p in stack.workers),
        "relay": lambda: process_cpu_s(stack.relay.pid),
        "baseline_worker": lambda: process_cpu_s(baseline.pid),
        "shape_worker": lambda: process_cpu_s(shape.pid),
        "temporal": lambda: process_cpu_s(sv.temporal.process.pid),
        "postgres": lambda: tree_cpu_s(sv.pg.pid),
        "bench_client": own,  # creates / starts and the polling, in this process
    }


def read_cpu(meter: CpuMeter) -> dict[str, float]:
    return {k: read() for k, read in meter.items()}


def cpu_delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a[k] for k in a}


# The bare sides of figure 1: the key under `figures.throughput`, the worker's CPU meter key,
# and whether it is the five-stage shape.
BARE_SIDES = (("baseline", "baseline_worker", False), ("shape", "shape_worker", True))
# Engine ÷ baseline jobs/s targets: the same shape (what the stages' own work costs) and the
# one-activity workflow (what the shape and the work cost together).
SHAPE_TARGET = 0.75
BASELINE_TARGET = 0.6
# Engine worker + relay CPU per job ÷ the bare five-stage worker's.
CPU_TARGET = 1.4
COMMITS_TARGET = 4.5


@dataclass
class _Runs:
    """The repetitions of figure 1 so far, and the readings the next engine run's commits are
    counted from: every commit between two readings but the idle rate's belongs to that run.
    Two counts: the COMMITs the engine's transactions send (pg_stat_statements: figure 5), and
    every transaction PostgreSQL counts (`pg_stat_database`, less the bench's own statements:
    also the rollbacks of the read-only stages, the transactions in which listening backends
    read the NOTIFY queue, and autovacuum's; flushed late, so approximate per run)."""

    ctx: Any
    meter: CpuMeter
    queues: dict[str, str]
    n: int
    idle_rate: float
    idle_cpu: dict[str, float]
    settle_s: float
    c_prev: int
    t_prev: float
    own_prev: int
    idle_commit_rate: float = 0.0
    commits_prev: int = 0
    rollbacks_prev: int = 0
    engine_runs: list[dict[str, Any]] = field(default_factory=list)
    bare_runs: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {side: [] for side, _, _ in BARE_SIDES}
    )

    async def bare(self, r: int, side: str, shape: bool) -> None:
        from bench.figures import baseline_throughput

        cpu0 = read_cpu(self.meter)
        b = await baseline_throughput(self.ctx, self.queues[side], self.n, f"r{r}", shape=shape)
        b["cpu_s"] = cpu_delta(cpu0, read_cpu(self.meter))
        b["cpu_s_per_job"] = {k: v / self.n for k, v in b["cpu_s"].items()}
        self.bare_runs[side].append(b)

    async def engine(self, r: int) -> None:
        from bench.figures import engine_throughput

        ctx, n = self.ctx, self.n
        cpu0, te0 = read_cpu(self.meter), time.perf_counter()
        e = await engine_throughput(ctx, n, f"r{r}")
        # Trailing work (completion events, workflow completions) lands in the settle time.
        await asyncio.sleep(self.settle_s)
        c, t = await ctx.admin.xacts(), time.perf_counter()
        commits, rollbacks = await ctx.admin.engine_xacts()
        cpu_idle_s = (t - te0) - e["elapsed_s"]
        e["cpu_s"] = {
            k: v - self.idle_cpu[k] * cpu_idle_s
            for k, v in cpu_delta(cpu0, read_cpu(self.meter)).items()
        }
        e["cpu_s_per_job"] = {k: v / n for k, v in e["cpu_s"].items()}
        e["cpu_idle_s_subtracted"] = cpu_idle_s
        own = ctx.edb.commits - self.own_prev
        # Everything between two readings but the engine's run (its settle time, the bare
        # runs) is idle for the engine's database.
        idle_s = (t - self.t_prev) - e["elapsed_s"]
        engine_xacts = (c - self.c_prev) - own - self.idle_rate * idle_s
        engine_commits = (commits - self.commits_prev) - self.idle_commit_rate * idle_s
        e["xact_commit"] = {
            "commits": commits - self.commits_prev,
            "rollbacks": rollbacks - self.rollbacks_prev,
            "idle_commit_rate_per_s": self.idle_commit_rate,
            "idle_s": idle_s,
            "engine": engine_commits,
            "per_job": engine_commits / n,
            "per_s": engine_commits / e["elapsed_s"],
            "rollbacks_per_job": (rollbacks - self.rollbacks_prev) / n,
            # pg_stat_database's own count of the same window, less the bench's statements.
            "all_delta": c - self.c_prev,
            "bench_own": own,
            "all_idle_rate_per_s": self.idle_rate,
            "all_per_job": engine_xacts / n,
        }
        self.c_prev, self.t_prev, self.own_prev = c, t, ctx.edb.commits
        self.commits_prev, self.rollbacks_prev = commits, rollbacks
        self.engine_runs.append(e)


async def _warm_and_probe(
    ctx: Any, args: argparse.Namespace, queues: dict[str, str], meter: CpuMeter
) -> _Runs:
    """Warm every side up, then measure the idle engine's commit rate and CPU once the warm-up's
    counts have settled."""
    from bench.figures import baseline_throughput, engine_throughput

    warm = args.warmup_jobs
    progress(f"throughput: warm-up ({warm} jobs each)")
    for side, _, shape in BARE_SIDES:
        await baseline_throughput(ctx, queues[side], warm, "warm", shape=shape)
    await engine_throughput(ctx, warm, "warm")
    # The idle engine still commits (the relay's poll, the deliverer's backstop); its rate is
    # measured once, after the warm-up's counts have settled, and subtracted below.
    settle_s = args.settle_seconds
    progress(f"throughput: {settle_s:g}s for PostgreSQL statistics to settle")
    await asyncio.sleep(settle_s)
    c_prev, t_prev, own_prev = await ctx.admin.xacts(), time.perf_counter(), ctx.edb.commits
    commits_prev, _ = await ctx.admin.engine_xacts()
    cpu_prev = read_cpu(meter)
    await asyncio.sleep(min(IDLE_PROBE_S, settle_s))
    c_idle, t_idle = await ctx.admin.xacts(), time.perf_counter()
    commits_idle, rollbacks_idle = await ctx.admin.engine_xacts()
    idle_rate = (c_idle - c_prev - (ctx.edb.commits - own_prev)) / (t_idle - t_prev)
    idle_commit_rate = (commits_idle - commits_prev) / (t_idle - t_prev)
    # Idle CPU (polls, timers) is subtracted the same way from the engine's settle time.
    idle_cpu = {k: v / (t_idle - t_prev) for k, v in cpu_delta(cpu_prev, read_cpu(meter)).items()}
    return _Runs(
        ctx=ctx,
        meter=meter,
        queues=queues,
        n=args.jobs,
        idle_rate=idle_rate,
        idle_cpu=idle_cpu,
        settle_s=settle_s,
        c_prev=c_idle,
        t_prev=t_idle,
        own_prev=ctx.edb.commits,
        idle_commit_rate=idle_commit_rate,
        commits_prev=commits_idle,
        rollbacks_prev=rollbacks_idle,
    )


async def fig_throughput(
    ctx: Any, args: argparse.Namespace, queues: dict[str, str], res: Results, meter: CpuMeter
) -> None:
    runs = await _warm_and_probe(ctx, args, queues, meter)
    runners: list[Callable[[int], Awaitable[None]]] = [
        *(
            (lambda r, side=side, shape=shape: runs.bare(r, side, shape))
            for side, _, shape in BARE_SIDES
        ),
        runs.engine,
    ]
    for r in range(args.reps):
        # The order rotates with each repetition, so drift on a shared machine hits all sides.
        for k in range(len(runners)):
            await runners[(r + k) % len(runners)](r)
        e, b, sh = runs.engine_runs[-1], runs.bare_runs["baseline"][-1], runs.bare_runs["shape"][-1]
        progress(
            f"throughput rep {r + 1}/{args.reps}: engine {e['jobs_per_s']:.1f} jobs/s, "
            f"shape {sh['jobs_per_s']:.1f}, one-activity {b['jobs_per_s']:.1f}; "
            f"{e['xact_commit']['per_job']:.2f} commits/job; CPU ms/job engine "
            f"{1e3 * sum(e['cpu_s_per_job'][k] for k in ENGINE_OWN_CPU):.2f}, shape worker "
            f"{1e3 * sh['cpu_s_per_job']['shape_worker']:.2f}, one-activity worker "
            f"{1e3 * b['cpu_s_per_job']['baseline_worker']:.2f}"
        )
    f = res.fig("throughput")
    _jobs_per_s(f, runs.engine_runs, runs.bare_runs)
    _cpu_per_job(f, runs.engine_runs, runs.bare_runs)
    _commits_per_job(res, runs.engine_runs)


def _jobs_per_s(
    f: dict[str, Any], eng_runs: list[dict[str, Any]], bare_runs: dict[str, list[dict[str, Any]]]
) -> None:
    f["engine"] = {
        "reps": eng_runs,
        "median_jobs_per_s": median([e["jobs_per_s"] for e in eng_runs]),
    }
    for side, _, _ in BARE_SIDES:
        f[side] = {
            "reps": bare_runs[side],
            "median_jobs_per_s": median([b["jobs_per_s"] for b in bare_runs[side]]),
        }
    # Ratios of medians, and the median of each repetition's own ratio (the three runs of one
    # repetition are minutes apart, so the latter is less exposed to the machine's drift).
    for side, target in (("baseline", BASELINE_TARGET), ("shape", SHAPE_TARGET)):
        prefix = "" if side == "baseline" else "shape_"
        f[f"{prefix}ratio"] = ratio(f["engine"]["median_jobs_per_s"], f[side]["median_jobs_per_s"])
        f[f"{prefix}ratio_per_rep_median"] = median(
            [
                ratio(e["jobs_per_s"], b["jobs_per_s"])
                for e, b in zip(eng_runs, bare_runs[side], strict=True)
            ]
        )
        f[f"{prefix}target"] = f">= {target}"
        f[f"{prefix}met"] = f[f"{prefix}ratio"] >= target


def _cpu_per_job(
    f: dict[str, Any], eng_runs: list[dict[str, Any]], bare_runs: dict[str, list[dict[str, Any]]]
) -> None:
    # CPU seconds per job: the processes each side runs (engine: worker + relay; a baseline:
    # its worker), and the same plus the Temporal server and PostgreSQL both use.
    sides: list[tuple[str, list[dict[str, Any]], tuple[str, ...]]] = [
        ("engine", eng_runs, ENGINE_OWN_CPU),
        *((side, bare_runs[side], (key,)) for side, key, _ in BARE_SIDES),
    ]
    for side, runs, own_keys in sides:
        f[side]["median_cpu_s_per_job"] = {
            k: median([x["cpu_s_per_job"][k] for x in runs]) for k in runs[0]["cpu_s_per_job"]
        }
        f[side]["median_own_cpu_s_per_job"] = median(
            [sum(x["cpu_s_per_job"][k] for k in own_keys) for x in runs]
        )
        f[side]["median_total_cpu_s_per_job"] = median(
            [sum(x["cpu_s_per_job"][k] for k in (*own_keys, *SERVER_CPU)) for x in runs]
        )
    for side in ("baseline", "shape"):
        prefix = "" if side == "baseline" else "shape_"
        f[f"{prefix}cpu_ratio"] = ratio(
            f["engine"]["median_own_cpu_s_per_job"], f[side]["median_own_cpu_s_per_job"]
        )
        f[f"{prefix}cpu_total_ratio"] = ratio(
            f["engine"]["median_total_cpu_s_per_job"], f[side]["median_total_cpu_s_per_job"]
        )
    # The target compares like with like: the engine's five stages against the bare five-stage
    # shape (the one-activity ratio is reported beside it, with no target).
    f["cpu_target"] = f"<= {CPU_TARGET}"
    f["cpu_met"] = f["shape_cpu_ratio"] <= CPU_TARGET


def _commits_per_job(res: Results, eng_runs: list[dict[str, Any]]) -> None:
    pg = res.fig("postgres")
    pg["commits_per_job"] = median([e["xact_commit"]["per_job"] for e in eng_runs])
    pg["rollbacks_per_job"] = median([e["xact_commit"]["rollbacks_per_job"] for e in eng_runs])
    pg["all_xacts_per_job"] = median([e["xact_commit"]["all_per_job"] for e in eng_runs])
    pg["engine_commits_per_s"] = median([e["xact_commit"]["per_s"] for e in eng_runs])
    pg["commits_target"] = f"<= {COMMITS_TARGET}"
    pg["commits_met"] = pg["commits_per_job"] <= COMMITS_TARGET
