"""The fairness figure (8): does a user with a few jobs wait behind another user's backlog?

One engine stack (relay + one worker, AI_INTERACTIVE_CONCURRENCY as the other figures) per mode,
started with fair dispatch on, then restarted with it off (`relay.fairness=false` through
bench/engine_cli.py: the relay then starts workflows without fairness keys, so jobs wait in
arrival order within a priority). Only one
stack runs at a time: two relays would claim each other's outbox rows. The Temporal dev server
always has `matching.enableFairness` on.

Per mode: a warm-up, then per repetition
- B alone: user `bench-b` creates 4 synthetic jobs (`delayMs` each) on the idle engine; time from
  B's first create to B's 4th job's `finished_at`;
- per backlog N: user `bench-a` creates N jobs, the bench waits until all N enqueue rows reached
  the relay (published: their workflows started, or held by A's dispatch window), then B creates
  4; B's time as above, and A's jobs/s = N / (A's first create -> A's last `finished_at`).
With fairness on, per repetition also:
- urgent backlog: the same with N = 40 jobs of A at `priority: 0` (the most urgent) and B's 4 at
  the default; B's time ÷ B alone (target 2: priority must not jump another user's jobs);
- priority within one user: user `bench-c` creates 12 jobs at priority 90, then 4 at priority 0;
  the urgent ones' mean finish rank among the 16 (1 = first; in arrival order 14.5).
Jobs are created through `JobService.create`, as in the other figures.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import time
from typing import Any

from temporalio.api.enums.v1 import EventType

from bench.figures import POLL_S, Ctx
from bench.infra import EngineKnobs, EngineStack, Servers
from bench.procs import check_alive, progress
from bench.stats import median, ratio
from jobs.service import CreateJobRequest

USER_A = "bench-a"
USER_B = "bench-b"
USER_C = "bench-c"
URGENT_BACKLOG = 40
URGENT_TARGET = 2.0
LOW_JOBS, URGENT_JOBS = 12, 4
B_JOBS = 4
TARGET_RATIO = 1.5
MODES = (("on", True), ("off", False))


def _req(
    user: str, tag: str, i: int, delay_ms: int, priority: int | None = None
) -> CreateJobRequest:
    return CreateJobRequest(
        user_id=user,
        job_type="synthetic",
        target_type="bench",
        target_id=f"fair-{tag}-{i}",
        input={"delayMs": delay_ms},
        priority=priority,
    )


async def _create(
    ctx: Ctx, user: str, tag: str, n: int, delay_ms: int, priority: int | None = None
) -> float:
    """Create `n` jobs for `user` (bounded concurrency); the wall time of the first create."""
    sem = asyncio.Semaphore(ctx.concurrency)

    async def one(i: int) -> None:
        async with sem:
            await ctx.svc.create(_req(user, tag, i, delay_ms, priority))

    wall0 = time.time()
    await asyncio.gather(*(one(i) for i in range(n)))
    return wall0


async def _wait(ctx: Ctx, sql: str, params: Any, n: int, timeout_s: float, what: str) -> None:
    t0 = time.monotonic()
    while True:
        rows = await ctx.edb.fetchall(sql, params)
        if int(rows[0][0]) >= n:
            return
        bad = await ctx.edb.fetchall(
            "SELECT count(*) FROM ai_job WHERE lifecycle_status IN ('failed', 'cancelled')"
        )
        if int(bad[0][0]):
            raise RuntimeError(f"{bad[0][0]} job(s) ended failed/cancelled")
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{what}: only {rows[0][0]}/{n} after {timeout_s:.0f}s")
        check_alive(ctx.watch)
        await asyncio.sleep(POLL_S)


async def _wait_user_done(ctx: Ctx, user: str, n: int, timeout_s: float) -> float:
    """Until `user` has `n` succeeded jobs; the epoch of their last `finished_at`."""
    await _wait(
        ctx,
        "SELECT count(*) FROM ai_job WHERE user_id = %s AND lifecycle_status = 'succeeded'",
        (user,),
        n,
        timeout_s,
        f"{user} succeeded",
    )
    rows = await ctx.edb.fetchall(
        "SELECT extract(epoch FROM max(finished_at)) FROM ai_job WHERE user_id = %s", (user,)
    )
    return float(rows[0][0])


PHASES = (
    "relay",  # created_at -> workflow started
    "first_wft_wait",  # started -> first workflow task started
    "first_wft",  # its run: PREPARE and RESOLVE (local activities)
    "execute_wait",  # EXECUTE scheduled -> started: the matching dispatch fairness orders
    "execute",  # EXECUTE started -> completed (the provider's delayMs)
    "last_wft_wait",  # EXECUTE completed -> next workflow task started
    "last_wft",  # its run: PROJECT and COMPLETE
)


async def b_phases(ctx: Ctx) -> dict[str, float]:
    """Where B's jobs spent their time, from their workflow histories: per phase, the median
    over B's jobs, in seconds."""
    rows = await ctx.edb.fetchall(
        "SELECT id, job_type, queue_name, extract(epoch FROM created_at) FROM ai_job "
        "WHERE user_id = %s",
        (USER_B,),
    )
    per: dict[str, list[float]] = {p: [] for p in PHASES}
    for job_id, job_type, queue, created in rows:
        handle = ctx.client.get_workflow_handle(f"{queue}:{job_type}:{job_id}")
        t: dict[str, float] = {}
        wft_started: list[float] = []
        wft_completed: list[float] = []
        async for e in handle.fetch_history_events():
            at = e.event_time.ToDatetime(tzinfo=dt.UTC).timestamp()
            kind = EventType.Name(e.event_type)
            if kind == "EVENT_TYPE_WORKFLOW_EXECUTION_STARTED":
                t["started"] = at
            elif kind == "EVENT_TYPE_WORKFLOW_TASK_STARTED":
                wft_started.append(at)
            elif kind == "EVENT_TYPE_WORKFLOW_TASK_COMPLETED":
                wft_completed.append(at)
            elif kind == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED":
                t.setdefault("scheduled", at)
            elif kind == "EVENT_TYPE_ACTIVITY_TASK_STARTED":
                t.setdefault("a_started", at)
            elif kind == "EVENT_TYPE_ACTIVITY_TASK_COMPLETED":
                t.setdefault("a_completed", at)
        if len(t) < 4 or len(wft_started) < 2 or len(wft_completed) < 2:
            continue  # not the five-stage shape this breakdown reads
        per["relay"].append(t["started"] - float(created))
        per["first_wft_wait"].append(wft_started[0] - t["started"])
        per["first_wft"].append(wft_completed[0] - wft_started[0])
        per["execute_wait"].append(t["a_started"] - t["scheduled"])
        per["execute"].append(t["a_completed"] - t["a_started"])
        last = next(x for x in wft_started if x >= t["a_completed"])
        per["last_wft_wait"].append(last - t["a_completed"])
        per["last_wft"].append(wft_completed[-1] - last)
    return {p: median(v) for p, v in per.items() if v}


def _phases_text(phases: dict[str, float]) -> str:
    return "(" + ", ".join(f"{p} {v * 1000:.0f}" for p, v in phases.items()) + " ms)"


async def b_alone(ctx: Ctx, delay_ms: int, tag: str) -> float:
    await ctx.edb.truncate()
    wall0 = await _create(ctx, USER_B, tag, B_JOBS, delay_ms)
    return await _wait_user_done(ctx, USER_B, B_JOBS, 120.0) - wall0


async def with_backlog(
    ctx: Ctx, n: int, delay_ms: int, concurrency: int, tag: str, a_priority: int | None = None
) -> dict[str, Any]:
    await ctx.edb.truncate()
    a0 = await _create(ctx, USER_A, f"{tag}-a", n, delay_ms, a_priority)
    # Every A job's enqueue row reached the relay before B's first create: published (its
    # workflow started) or held by A's dispatch window.
    await _wait(
        ctx,
        "SELECT count(*) FROM outbox_event WHERE event_type = 'ai.job.enqueue' "
        "AND (status = 'published' OR held_at IS NOT NULL)",
        None,
        n,
        60.0 + n / 10.0,
        "A's enqueue rows published",
    )
    a_done_at_b = await ctx.edb.fetchall(
        "SELECT count(*) FROM ai_job WHERE user_id = %s AND lifecycle_status = 'succeeded'",
        (USER_A,),
    )
    b0 = await _create(ctx, USER_B, f"{tag}-b", B_JOBS, delay_ms)
    # Unfair worst case: B waits for the whole backlog, N x delay / concurrency.
    timeout = 120.0 + 3.0 * n * delay_ms / 1000 / max(1, concurrency)
    b_end = await _wait_user_done(ctx, USER_B, B_JOBS, timeout)
    a_end = await _wait_user_done(ctx, USER_A, n, timeout)
    phases = await b_phases(ctx)
    return {
        "b_phases_s": phases,
        "backlog": n,
        "b_s": b_end - b0,
        "a_jobs_per_s": n / (a_end - a0),
        "a_s": a_end - a0,
        "a_succeeded_when_b_started": int(a_done_at_b[0][0]),
        "a_created_before_b_s": b0 - a0,
    }


async def within_user(ctx: Ctx, delay_ms: int, tag: str) -> float:
    """User C's 12 jobs at priority 90, then 4 at priority 0: the urgent ones' mean finish
    rank among the 16 (1 = first)."""
    await ctx.edb.truncate()
    await _create(ctx, USER_C, f"{tag}-low", LOW_JOBS, delay_ms, 90)
    await _create(ctx, USER_C, f"{tag}-urgent", URGENT_JOBS, delay_ms, 0)
    await _wait_user_done(ctx, USER_C, LOW_JOBS + URGENT_JOBS, 120.0)
    rows = await ctx.edb.fetchall(
        "SELECT priority FROM ai_job WHERE user_id = %s ORDER BY finished_at, id", (USER_C,)
    )
    ranks = [i + 1 for i, (prio,) in enumerate(rows) if prio == 0]
    return sum(ranks) / len(ranks)


async def _priority_runs(ctx: Ctx, delay: int, conc: int, tag: str, m: dict[str, Any]) -> None:
    """Fairness on only: the urgent backlog and the order within one user, once each."""
    run = await with_backlog(ctx, URGENT_BACKLOG, delay, conc, f"{tag}-urgent", a_priority=0)
    m.setdefault("urgent", []).append(run)
    rank = await within_user(ctx, delay, f"{tag}-within")
    m.setdefault("within_rank", []).append(rank)
    progress(
        f"fairness on {tag}: B behind {URGENT_BACKLOG} urgent {run['b_s']:.2f}s; "
        f"urgent jobs' mean finish rank {rank:.2f} of {LOW_JOBS + URGENT_JOBS}"
    )


async def phase_fairness(
    ctx: Ctx, args: argparse.Namespace, sv: Servers, knobs: EngineKnobs, res: Any
) -> None:
    delay, backlogs, conc = (
        args.fairness_delay_ms,
        args.fairness_backlogs,
        knobs.interactive_concurrency,
    )
    f = res.fig("fairness")
    f["method"] = (
        f"one relay + 1 worker (AI_INTERACTIVE_CONCURRENCY={conc}) per mode, restarted with "
        "fair dispatch on/off (the relay's `fairness`); "
        f"synthetic jobs with delayMs={delay}; B = {B_JOBS} jobs of "
        f"{USER_B}; backlog = jobs of {USER_A} all created and their enqueue rows published "
        "before B's first create; times from SQL finished_at"
    )
    f["delay_ms"] = delay
    f["backlogs"] = backlogs
    f["modes"] = {}
    for mode, flag in MODES:
        mk = dataclasses.replace(knobs, constants={**knobs.constants, "relay.fairness": flag})
        stack = EngineStack(f"fair-{mode}", sv, mk, workers=1)
        m: dict[str, Any] = {"alone": [], "backlog": {str(n): [] for n in backlogs}}
        try:
            await stack.start(ctx.client, ctx.admin)
            ctx.watch = list(stack.procs)
            progress(f"fairness {mode}: warm-up")
            await with_backlog(ctx, max(8, 2 * conc), delay, conc, f"{mode}-warm")
            for r in range(args.reps):
                alone = await b_alone(ctx, delay, f"{mode}-r{r}-alone")
                m["alone"].append(alone)
                m.setdefault("alone_phases_s", []).append(await b_phases(ctx))
                progress(
                    f"fairness {mode} rep {r + 1}/{args.reps}: B alone {alone:.2f}s "
                    f"{_phases_text(m['alone_phases_s'][-1])}"
                )
                for n in backlogs:
                    run = await with_backlog(ctx, n, delay, conc, f"{mode}-r{r}-n{n}")
                    m["backlog"][str(n)].append(run)
                    progress(
                        f"fairness {mode} rep {r + 1}/{args.reps} N={n}: B {run['b_s']:.2f}s, "
                        f"A {run['a_jobs_per_s']:.2f} jobs/s {_phases_text(run['b_phases_s'])}"
                    )
                if mode == "on":
                    await _priority_runs(ctx, delay, conc, f"r{r}", m)
        finally:
            ctx.watch = []
            stack.stop()
            res.record_procs(stack.procs)
            await ctx.edb.truncate()
        m["median_alone_s"] = median(m["alone"])
        f["modes"][mode] = m
    # B's time is compared with B alone with fairness on (the engine's default): the same
    # 4 jobs on an idle engine, which the mode cannot change.
    alone = f["modes"]["on"]["median_alone_s"]
    f["b_alone_s"] = alone
    f["b_alone_off_s"] = f["modes"]["off"]["median_alone_s"]
    rows = []
    for n in backlogs:
        for mode, _ in MODES:
            runs = f["modes"][mode]["backlog"][str(n)]
            b = median([x["b_s"] for x in runs])
            rows.append(
                {
                    "backlog": n,
                    "mode": mode,
                    "b_s": b,
                    "b_ratio": ratio(b, alone),
                    "a_jobs_per_s": median([x["a_jobs_per_s"] for x in runs]),
                }
            )
    f["rows"] = rows
    _priority_summary(f, alone)
    f["target"] = f"B within {TARGET_RATIO} x alone (fairness on)"
    f["met"] = all(r["b_ratio"] <= TARGET_RATIO for r in rows if r["mode"] == "on")


def _priority_summary(f: dict[str, Any], alone: float) -> None:
    """The urgent backlog's and the order within one user's figures, from the "on" mode."""
    on = f["modes"]["on"]
    urgent_b = median([x["b_s"] for x in on["urgent"]])
    f["urgent"] = {
        "backlog": URGENT_BACKLOG,
        "b_s": urgent_b,
        "b_ratio": ratio(urgent_b, alone),
        "a_jobs_per_s": median([x["a_jobs_per_s"] for x in on["urgent"]]),
        "target": URGENT_TARGET,
        "met": ratio(urgent_b, alone) <= URGENT_TARGET,
    }
    f["within_user"] = {
        "low": LOW_JOBS,
        "urgent": URGENT_JOBS,
        "urgent_mean_rank": median(on["within_rank"]),
        "arrival_order_rank": LOW_JOBS + (URGENT_JOBS + 1) / 2,
    }


def render(f: dict[str, Any]) -> list[str]:
    from bench.table import met, num

    lines = [
        "",
        f"Fairness (8): {B_JOBS} jobs of user B behind user A's backlog, synthetic delayMs="
        f"{f['delay_ms']}; B alone on an idle engine {num(f['b_alone_s'], '.2f')} s "
        f"(fairness off: {num(f['b_alone_off_s'], '.2f')} s)",
        "",
        "| Backlog N | Fairness | B's time (s) | B ÷ B alone | A's jobs/s | Target | Met |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in f["rows"]:
        on = r["mode"] == "on"
        lines.append(
            f"| {r['backlog']} | {r['mode']} | {num(r['b_s'], '.2f')} | {num(r['b_ratio'], '.2f')} "
            f"| {num(r['a_jobs_per_s'], '.2f')} | {'≤ ' + str(TARGET_RATIO) if on else '—'} "
            f"| {met(r['b_ratio'] <= TARGET_RATIO) if on else '—'} |"
        )
    u, w = f.get("urgent"), f.get("within_user")
    if u and w:
        lines += [
            "",
            f"Priority: B behind {u['backlog']} jobs of A at priority 0: "
            f"{num(u['b_s'], '.2f')} s, {num(u['b_ratio'], '.2f')} x alone "
            f"(target ≤ {u['target']}: {met(u['met'])}); A {num(u['a_jobs_per_s'], '.2f')} "
            f"jobs/s. One user's {w['urgent']} urgent jobs created after {w['low']} at "
            f"priority 90 finish at mean rank {num(w['urgent_mean_rank'], '.2f')} "
            f"(arrival order: {w['arrival_order_rank']}).",
        ]
    return lines
