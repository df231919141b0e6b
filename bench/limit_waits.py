"""`python -m bench.limit_waits`: what jobs waiting for a provider limit cost the database
(docs/limits.md "How a wait works", docs/benchmarks.md "Waiting for a provider limit").

One embedded PostgreSQL and one in-memory Temporal dev server (`bench.infra.servers`); an engine
stack (`aijobs relay` + one `aijobs worker --queue ai-interactive`) with the synthetic model
under `AI_MODEL_LIMITS={"synthetic": {"concurrency": 1}}`. Transactions are PostgreSQL's own
count for the engine's database (`pg_stat_database` xact_commit + xact_rollback), read from
another database, less PostgreSQL's own autovacuum and autoanalyze runs in the window
(`pg_stat_all_tables`); the bench sends nothing to the engine's database during a window.

The case that counts is the default one: the `--jobs` (20) jobs belong to ONE user (`--users`,
1) under the default `USER_DISPATCH_WINDOW` (`--dispatch-window`, 4), so 4 of them are
dispatched and wait in the key's queue while the other 16 wait in the outbox, held by the
window. (The figures of 2.65 and 3.85 this bench once reported were measured with the jobs
spread over four users and no window: all 20 dispatched.)

1. idle: the stack with no job, over `--window` seconds: the baseline of the same run;
2. concurrency: a call holds the only slot for longer than the window (its lease inserted as a
   killed worker's would be left: its end sends no NOTIFY, so each waiter is woken by its own
   backstop, the worst case), `--jobs` jobs wait behind it (the dispatched ones in
   `limit_waiter` before the window opens); then the lease goes with a NOTIFY, as a call's end
   does, and they all run;
3. idle again once they ran (a worker that ran calls keeps a residue of its own);
4. announced: the key blocked by an announced reset (`provider_limit.blocked_until`, as a
   provider's `x-ratelimit-remaining-*: 0` sets it) for longer than the window, `--jobs` jobs
   waiting for it.

Each wait is reported as transactions per waiting job per minute, raw ((window's count) / jobs /
minutes) and net of the idle baseline over the same duration. Then the idle stack's cost is
split by loop: the same stack again with one loop slowed to one poll an hour (the relay's
`RELAY_POLL_INTERVAL_S`, the webhook deliverer's `POLL_INTERVAL_S`, a constant changed through
bench/engine_cli.py); what that loop cost is the difference. The worker alone (the relay process
stopped) gives the rest, the limit waker included.

The polling this replaced (EXECUTE asked again every second while a concurrency slot was
taken: one rolled-back transaction per look) is not run here: it was about 55 looks, so 55
transactions, per waiting job per minute (1 s + up to 10 % jitter per look).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.infra import DB_NAME, Admin, EngineDb, EngineKnobs, EngineStack, Servers, servers
from bench.procs import progress

LIMITS = {"synthetic": {"concurrency": 1}}
# Each loop's poll: a setting, or a constant (a dotted `module.NAME`, bench/engine_cli.py).
SLOW_LOOPS = {
    "relay": "RELAY_POLL_INTERVAL_S",
    "webhook deliverer": "activities.webhooks.POLL_INTERVAL_S",
}
POLL_S = 0.1


async def xacts(admin: Admin) -> int:
    return int(
        await admin.one(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            (DB_NAME,),
        )
    )


async def autovacuums(edb: EngineDb) -> int:
    """PostgreSQL's own maintenance of the engine's tables so far (autovacuum and autoanalyze
    runs): transactions the engine did not send, taken out of every window."""
    rows = await edb.fetchall(
        "SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_all_tables"
    )
    return int(rows[0][0])


async def per_minute(admin: Admin, window_s: float, edb: EngineDb | None = None) -> float:
    """The engine's transactions per minute on its database over `window_s`, the bench quiet
    (its own reads of the maintenance counts fall outside the window), less PostgreSQL's own
    maintenance runs in it. A backend reports its transactions to the statistics when it goes
    idle, up to 10 s later: each window opens after `--settle` seconds of calm, or a burst
    before it (creating the jobs, their first looks) would be counted in it."""
    vac0 = await autovacuums(edb) if edb is not None else 0
    before, t0 = await xacts(admin), time.monotonic()
    await asyncio.sleep(window_s)
    after, t1 = await xacts(admin), time.monotonic()
    vac1 = await autovacuums(edb) if edb is not None else 0
    return (after - before - (vac1 - vac0)) * 60.0 / (t1 - t0)


async def until(edb: EngineDb, sql: str, want: int, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while int((await edb.fetchall(sql))[0][0]) < want:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached in {timeout_s:.0f}s")
        await asyncio.sleep(POLL_S)


async def drained(edb: EngineDb, settle_s: float, timeout_s: float = 120.0) -> None:
    """Until the relay has published every outbox row (the ending events of the jobs before),
    then `settle_s` of calm: the work of earlier jobs is not counted in the next window."""
    deadline = time.monotonic() + timeout_s
    sql = "SELECT count(*) FROM outbox_event WHERE status IN ('pending', 'processing')"
    while int((await edb.fetchall(sql))[0][0]) > 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the outbox not drained in {timeout_s:.0f}s")
        await asyncio.sleep(POLL_S)
    await asyncio.sleep(settle_s)


async def create(svc: Any, n: int, tag: str, users: int, delay_ms: int = 0) -> None:
    from jobs.service import CreateJobRequest

    for i in range(n):
        await svc.create(
            CreateJobRequest(
                user_id=f"bench-u{i % users}",
                job_type="synthetic",
                target_type="bench",
                target_id=f"{tag}-{i}",
                input={"delayMs": delay_ms},
            )
        )


async def all_done(edb: EngineDb, total: int) -> None:
    await until(
        edb,
        "SELECT count(*) FROM ai_job WHERE lifecycle_status = 'succeeded'",
        total,
        "every job succeeded",
        timeout_s=300,
    )


async def concurrency_phase(ctx: Any, args: argparse.Namespace) -> float:
    """`args.jobs` jobs behind a call that holds the only slot for longer than the window and
    whose end is never announced (a lease as a killed worker leaves it: no NOTIFY), so each
    waiter's backstop is what wakes it: the worst case. Their transactions/min."""
    edb, n = ctx.edb, args.jobs
    await edb.fetchall(
        "INSERT INTO provider_call_lease (id, provider, model, key_ref, job_id, tokens, "
        "expires_at) VALUES (gen_random_uuid(), 'synthetic', 'synthetic', 'platform', "
        f"gen_random_uuid(), 0, clock_timestamp() + interval '{2 * args.window + 60} seconds')"
    )
    await create(ctx.svc, n, "behind", args.users)
    await until(edb, "SELECT count(*) FROM limit_waiter", waiters(args), f"{n} jobs waiting")
    await asyncio.sleep(args.settle)  # see `per_minute`: counts reach the statistics late
    rate = await per_minute(ctx.admin, args.window, ctx.edb)
    # The call "ends": its lease goes and its key is notified, as a call's last transaction does.
    await edb.fetchall("DELETE FROM provider_call_lease")
    await edb.fetchall(
        "SELECT pg_notify('aijobs_limit_freed', "
        '\'{"p":"synthetic","m":"synthetic","k":"platform"}\')'
    )
    await all_done(edb, n)
    return rate


async def announced_phase(ctx: Any, args: argparse.Namespace, done: int) -> float:
    """`args.jobs` jobs waiting for an announced reset; their transactions/min."""
    edb, n = ctx.edb, args.jobs
    await drained(edb, args.settle)
    block_s = 2 * args.settle + args.window + 30  # the reset comes after the window
    await edb.fetchall(
        "INSERT INTO provider_limit (provider, model, key_ref, requests_available, "
        "tokens_available, refilled_at, blocked_until) VALUES ('synthetic', 'synthetic', "
        "'platform', 'Infinity', 'Infinity', clock_timestamp(), clock_timestamp() + "
        f"interval '{block_s} seconds') ON CONFLICT (provider, model, key_ref) DO UPDATE SET "
        "blocked_until = EXCLUDED.blocked_until"
    )
    await create(ctx.svc, n, "announced", args.users)
    await until(edb, "SELECT count(*) FROM limit_waiter", waiters(args), f"{n} jobs waiting")
    await asyncio.sleep(args.settle)  # see `per_minute`: counts reach the statistics late
    rate = await per_minute(ctx.admin, args.window, ctx.edb)
    await all_done(edb, done + n)
    return rate


def waiters(args: argparse.Namespace) -> int:
    """How many of the waiting jobs reach the key's queue: every user's dispatch window's worth
    (the others wait in the outbox, held by it, at no cost)."""
    return int(min(args.jobs, args.users * args.dispatch_window))


def stack(sv: Servers, args: argparse.Namespace, name: str, slow: str | None = None) -> EngineStack:
    """The bench's stack; `slow`: a loop's poll (a SLOW_LOOPS value) at one an hour."""
    env = {
        "AI_MODEL_LIMITS": json.dumps(LIMITS),
        "USER_DISPATCH_WINDOW": str(args.dispatch_window),
    }
    constants: dict[str, Any] = {}
    if slow is not None and "." in slow:
        constants[slow] = 3600
    elif slow is not None:
        env[slow] = "3600"
    knobs = EngineKnobs(
        interactive_concurrency=args.interactive_concurrency,
        log_level=args.log_level,
        extra_env=env,
        constants=constants,
    )
    return EngineStack(name, sv, knobs, workers=1)


async def waits(ctx: Any, sv: Servers, args: argparse.Namespace) -> dict[str, Any]:
    """The idle baseline and both waits, on one stack; then the worker alone, idle."""
    st = stack(sv, args, "waits")
    try:
        await st.start(ctx.client, ctx.admin)
        await asyncio.sleep(args.settle)
        idle = await per_minute(ctx.admin, args.window, ctx.edb)
        progress(f"idle stack: {idle:.1f} transactions/min")
        conc = await concurrency_phase(ctx, args)
        progress(f"concurrency wait: {conc:.1f} transactions/min for {args.jobs} jobs")
        await drained(ctx.edb, args.settle)
        # The stack idle again after jobs ran: a worker that ran calls keeps a residue of its
        # own (docs/benchmarks.md), which the announced wait is also compared with.
        idle_after = await per_minute(ctx.admin, args.window, ctx.edb)
        progress(f"idle stack after jobs: {idle_after:.1f} transactions/min")
        ann = await announced_phase(ctx, args, args.jobs)
        progress(f"announced wait: {ann:.1f} transactions/min for {args.jobs} jobs")
        await drained(ctx.edb, 0.0)
        st.relay.stop()
        await asyncio.sleep(args.settle)
        worker_only = await per_minute(ctx.admin, args.window, ctx.edb)
        progress(f"worker alone, idle: {worker_only:.1f} transactions/min")
    finally:
        st.stop()
    n = args.jobs
    return {
        "idle_per_min": idle,
        "worker_alone_idle_per_min": worker_only,
        "concurrency": {"raw": conc / n, "net": (conc - idle) / n},
        "announced": {
            "raw": ann / n,
            "net": (ann - idle) / n,
            "net_of_idle_after_jobs": (ann - idle_after) / n,
        },
        "idle_after_jobs_per_min": idle_after,
    }


async def loop_costs(ctx: Any, sv: Servers, args: argparse.Namespace) -> dict[str, float]:
    """The idle stack with each relay-process loop slowed to one poll an hour in turn."""
    out: dict[str, float] = {}
    for loop, setting in SLOW_LOOPS.items():
        await ctx.edb.truncate()
        st = stack(sv, args, f"slow-{loop.split()[0]}", slow=setting)
        try:
            await st.start(ctx.client, ctx.admin)
            await asyncio.sleep(args.settle)
            out[loop] = await per_minute(ctx.admin, args.window, ctx.edb)
            progress(f"idle with the {loop} slowed: {out[loop]:.1f} transactions/min")
        finally:
            st.stop()
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from temporalio.client import Client

    from db.session import make_engine, make_sessionmaker
    from jobs.service import CreatePolicy, JobService
    from jobs.types import default_catalog

    with servers(keep=args.keep) as sv:
        client = await Client.connect(sv.temporal_address, namespace="default")
        admin, edb = Admin(sv.admin_uri), EngineDb(sv.database_url)
        await admin.open()
        await edb.open()
        engine = make_engine(sv.database_url, pool_size=4, max_overflow=4)
        svc = JobService(
            make_sessionmaker(engine),
            default_catalog(),
            CreatePolicy(max_active_jobs=0, max_jobs_per_day=0, synthetic_public=True),
        )
        ctx = argparse.Namespace(client=client, svc=svc, edb=edb, admin=admin)
        try:
            out = await waits(ctx, sv, args)
            slowed = await loop_costs(ctx, sv, args) if args.loops else {}
        finally:
            await engine.dispose()
            await edb.close()
            await admin.close()
    out["idle_with_loop_slowed_per_min"] = slowed
    out["loop_cost_per_min"] = {k: out["idle_per_min"] - v for k, v in slowed.items()}
    out["jobs"], out["window_s"] = args.jobs, args.window
    return out


def render(s: dict[str, Any]) -> str:
    lines = [
        f"Waiting for a provider limit: {s['jobs']} jobs, windows of {s['window_s']:.0f} s",
        "",
        "| wait | transactions per waiting job per minute, raw | net of idle |",
        "|---|---:|---:|",
    ]
    for name in ("concurrency", "announced"):
        lines.append(f"| {name} | {s[name]['raw']:.2f} | {s[name]['net']:.2f} |")
    lines.append(
        f"\nannounced, net of the idle stack after jobs ({s['idle_after_jobs_per_min']:.1f}/min): "
        f"{s['announced']['net_of_idle_after_jobs']:.2f}"
    )
    lines += [
        "",
        f"idle stack (relay process + one worker): {s['idle_per_min']:.1f} transactions/min; "
        f"the worker alone: {s['worker_alone_idle_per_min']:.1f}/min",
    ]
    for loop, cost in s["loop_cost_per_min"].items():
        lines.append(f"- {loop}: {cost:.1f} transactions/min")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.limit_waits", description=__doc__)
    p.add_argument("--jobs", type=int, default=20, help="waiting jobs per wait (20)")
    p.add_argument("--users", type=int, default=1, help="users the jobs belong to (1)")
    p.add_argument(
        "--dispatch-window", type=int, default=4, help="USER_DISPATCH_WINDOW (4, the default)"
    )
    p.add_argument("--window", type=float, default=60.0, help="seconds per measurement (60)")
    p.add_argument(
        "--settle", type=float, default=15.0, help="seconds of calm before each window (15)"
    )
    p.add_argument("--no-loops", dest="loops", action="store_false", help="skip the loop split")
    p.add_argument(
        "--interactive-concurrency", type=int, default=4, help="AI_INTERACTIVE_CONCURRENCY (4)"
    )
    p.add_argument("--log-level", default="WARNING", help="LOG_LEVEL of the engine processes")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (data and logs)")
    p.add_argument("--output", help="also write the figures as JSON here")
    args = p.parse_args(argv)
    summary = asyncio.run(run(args))
    print(render(summary))
    if args.output:
        Path(args.output).write_text(json.dumps(summary, indent=2))
        print(f"figures in {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
