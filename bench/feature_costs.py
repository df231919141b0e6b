"""`python -m bench.feature_costs`: the engine transactions each feature adds to a job that uses
it (docs/benchmarks.md, "What a plain job pays after the round of features").

One embedded PostgreSQL and one in-memory Temporal dev server (`bench.infra.servers`); `aijobs
relay` and one `aijobs worker --queue ai-interactive` per engine configuration
(`bench/feature_rows.py` STACKS): the synthetic provider, or for the batch tier the scripted
OpenAI-compatible server (tests/fakes/openai_server.py, its own process). Per row
(`feature_rows.rows`), from empty tables: `--jobs` jobs of 16 users created through
`JobService.create`, `--concurrency` at a time, each row `--reps` times (the rows in turn);
then until every job ended, every outbox row was published and no engine session is inside a
statement or a transaction. What the row cost is the COMMIT and ROLLBACK statements the
engine's sessions sent meanwhile (pg_stat_statements, `Admin.engine_xacts`: exact, whatever the
machine's load), less the idle stack's rate over the row's time (measured once per stack), per
job; the bench's own statements are autocommit and not counted. The bench's own use cases (a
pause's create and lift, a scope budget's put) are engine transactions and counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.feature_rows import STACKS, Row, RowCtx, fake_answer, rows
from bench.infra import Admin, EngineDb, EngineKnobs, EngineStack, Servers, engine_env, servers
from bench.procs import Proc, check_alive, child_env, progress
from bench.stats import median

# Rows whose figure comes from another bench (name, commits delta per job, note).
BORROWED = (
    (
        "streamed items (quiz, 20 items)",
        "+18.5 (pg_stat_database, bench/stream_items.py)",
        "not measured here: the synthetic provider does not stream",
    ),
)
NOT_MEASURED: tuple[tuple[str, str], ...] = ()
ENDED = "('succeeded', 'failed', 'cancelled')"


async def _wait_ended(edb: EngineDb, n: int, timeout_s: float, watch: list[Any]) -> float:
    """Until `n` jobs ended and every outbox row is published; the time it took."""
    t0 = time.monotonic()
    while True:
        rows = await edb.fetchall(
            f"SELECT (SELECT count(*) FROM ai_job WHERE lifecycle_status IN {ENDED}), "
            "(SELECT count(*) FROM outbox_event WHERE published_at IS NULL)"
        )
        ended, unpublished = int(rows[0][0]), int(rows[0][1])
        if ended >= n and not unpublished:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{ended}/{n} jobs ended, {unpublished} outbox rows unpublished")
        check_alive(watch)
        await asyncio.sleep(0.2)


async def _outcomes(edb: EngineDb) -> dict[str, int]:
    rows = await edb.fetchall(
        "SELECT lifecycle_status || coalesce('/' || error_code, ''), count(*) FROM ai_job "
        "GROUP BY 1 ORDER BY 1"
    )
    out = {str(k): int(v) for k, v in rows}
    # Jobs a dispatch window held: dispatched well after their create (a call lasts 300 ms).
    late = await edb.fetchall(
        "SELECT count(*) FROM ai_job WHERE dispatched_at > created_at + interval '250 ms'"
    )
    out["dispatched_250ms_after_create"] = int(late[0][0])
    return out


@dataclass
class Bench:
    """One stack's parts: the bench's job service and session factory over the engine database,
    the engine database and the admin connection, the stack and its idle transaction rate."""

    svc: Any  # jobs.service.JobService
    sm: Any  # db.session.SessionMaker
    edb: EngineDb
    admin: Admin
    st: EngineStack
    idle_rate: float = 0.0


async def measure_row(row: Row, args: argparse.Namespace, b: Bench) -> dict[str, Any]:
    """One row from empty tables: creates, their jobs to their ends, the engine's transactions."""
    svc, sm, edb, admin, st = b.svc, b.sm, b.edb, b.admin, b.st
    await admin.wait_quiet()
    await edb.truncate()
    ctx = RowCtx(sessionmaker=sm, edb=edb, jobs=args.jobs)
    c0, r0 = await admin.engine_xacts()
    t0 = time.monotonic()
    if row.before is not None:
        await row.before(ctx)
    sem = asyncio.Semaphore(args.concurrency)
    tag = row.name.split()[0][:12]

    async def one(i: int) -> None:
        async with sem:
            await svc.create(row.build(i, tag))

    await asyncio.gather(*(one(i) for i in range(args.jobs)))
    if row.after is not None:
        await row.after(ctx)
    await _wait_ended(edb, args.jobs, args.timeout, st.procs)
    await asyncio.sleep(args.settle)  # workflow completions, a last mark
    await admin.wait_quiet()
    c1, r1 = await admin.engine_xacts()
    elapsed = time.monotonic() - t0
    idle = b.idle_rate * elapsed
    n = args.jobs
    out = {
        "feature": row.name,
        "jobs": n,
        "commits": c1 - c0,
        "rollbacks": r1 - r0,
        "elapsed_s": round(elapsed, 1),
        "idle_subtracted": round(idle, 2),
        "commits_per_job": (c1 - c0 - idle) / n,
        "rollbacks_per_job": (r1 - r0) / n,
        "outcomes": await _outcomes(edb),
        "reference": row.reference,
        "note": row.note,
    }
    progress(f"{row.name}: {json.dumps({k: out[k] for k in list(out)[1:8]})}")
    return out


async def _idle_rate(admin: Admin, seconds: float) -> float:
    """The idle stack's COMMIT + ROLLBACK rate (its relay's poll, backstops)."""
    await admin.wait_quiet()
    c0, r0 = await admin.engine_xacts()
    await asyncio.sleep(seconds)
    c1, r1 = await admin.engine_xacts()
    return ((c1 - c0) + (r1 - r0)) / seconds


def stack_policy(env: dict[str, str]) -> Any:
    """The create policy the engine's processes build from `env` (runtime/wiring.py)."""
    from unittest import mock

    from engine.settings import Settings
    from runtime.wiring import create_policy

    with mock.patch.dict(os.environ, env, clear=True):
        return create_policy(Settings())


async def run_stack(
    name: str,
    chosen: list[Row],
    args: argparse.Namespace,
    sv: Servers,
    client: Any,
    fake_root: str = "",
) -> list[dict[str, Any]]:
    from db.session import make_engine, make_sessionmaker
    from jobs.service import CreatePolicy, JobService
    from jobs.types import default_catalog

    env = {k: v.replace("{fake}", fake_root) for k, v in STACKS[name].items()}
    knobs = EngineKnobs(
        interactive_concurrency=args.interactive_concurrency, log_level="WARNING", extra_env=env
    )
    st = EngineStack(name, sv, knobs, workers=1)
    engine = make_engine(sv.database_url, pool_size=args.concurrency, max_overflow=4)
    sm = make_sessionmaker(engine)
    policy = CreatePolicy(max_active_jobs=0, max_jobs_per_day=0)
    if env:  # the create's checks see the provider and its limits as the engine does
        policy = stack_policy(engine_env(sv, knobs, suffix=st.suffix, quotas=False))
    svc = JobService(sm, default_catalog(), policy)
    admin, edb = Admin(sv.admin_uri), EngineDb(sv.database_url)
    await admin.open()
    await edb.open()
    b = Bench(svc=svc, sm=sm, edb=edb, admin=admin, st=st)
    out: list[dict[str, Any]] = []
    try:
        await st.start(client, admin)
        warm = argparse.Namespace(**{**vars(args), "jobs": args.warmup})
        # Warm-up (imports, pools, caches): the counts do not depend on it, the times do.
        await measure_row(chosen[0], warm, b)
        await asyncio.sleep(args.settle)
        b.idle_rate = await _idle_rate(admin, args.idle_seconds)
        progress(f"{name}: idle stack {b.idle_rate * 60:.1f} transactions a minute")
        for r in range(args.reps):  # the rows in turn, so drift hits each alike
            for row in chosen:
                out.append({**await measure_row(row, args, b), "rep": r})
    finally:
        st.stop()
        await engine.dispose()
        await edb.close()
        await admin.close()
    return out


def medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per feature, in first-seen order: the median of its repetitions' COMMITs and
    ROLLBACKs per job, and each repetition's total (the relay's claims and marks are shared by
    the jobs created close together, so a row's count varies a little from run to run)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["feature"], []).append(r)
    out = []
    for name, reps in by.items():
        out.append(
            {
                "feature": name,
                "reference": reps[0]["reference"],
                "note": reps[0].get("note", ""),
                "commits_per_job": median([r["commits_per_job"] for r in reps]),
                "rollbacks_per_job": median([r["rollbacks_per_job"] for r in reps]),
                "totals_per_job": [
                    round(r["commits_per_job"] + r["rollbacks_per_job"], 3) for r in reps
                ],
                "runs": reps,
            }
        )
    return out


def deltas(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with its transactions per job less its reference row's (None for a reference)."""
    by_name = {r["feature"]: r for r in results}
    out = []
    for r in results:
        ref = by_name.get(r["reference"]) if r["reference"] else None
        total = r["commits_per_job"] + r["rollbacks_per_job"]
        delta = None
        if ref is not None:
            delta = total - (ref["commits_per_job"] + ref["rollbacks_per_job"])
        out.append({**r, "delta_per_job": delta})
    return out


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table of docs/benchmarks.md: measured rows, borrowed ones, those not
    measured."""
    lines = [
        "| feature | COMMITs per job | ROLLBACKs per job | Δ transactions per job vs plain |",
        "|---|---:|---:|---:|",
    ]
    for r in results:
        d = r["delta_per_job"]
        shown = f"{d:+.2f}" if d is not None else "reference"
        if d is None and r["reference"]:
            shown = f"({r['reference']} not run)"
        if d is not None and r["reference"] != "plain":
            shown += f" (vs {r['reference']})"
        name = r["feature"]
        lines.append(
            f"| {name} | {r['commits_per_job']:.2f} | {r['rollbacks_per_job']:.2f} | {shown} |"
        )
    for name, delta, why in BORROWED:
        lines.append(f"| {name} | — | — | {delta}; {why} |")
    for name, why in NOT_MEASURED:
        lines.append(f"| {name} | not measured | | {why} |")
    return "\n".join(lines)


async def start_fake(sv: Servers) -> tuple[Proc, str]:
    """The scripted OpenAI-compatible server, its own process, answering every call and batch
    line with a valid flashcard answer; and its root URL."""
    from runtime.embedded import free_port

    port = free_port()
    fake = Proc(
        "fake-provider",
        [sys.executable, "-m", "tests.fakes.openai_server", "--port", str(port)],
        child_env({}),
        sv.log_dir,
    )
    fake.start()
    root = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
        for _ in range(300):
            try:
                r = await http.post(f"{root}/_script", json={"steps": [], "default": fake_answer()})
                r.raise_for_status()
                return fake, root
            except httpx.HTTPError:
                await asyncio.sleep(0.1)
    fake.stop()
    raise TimeoutError("the fake provider did not answer")


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from temporalio.client import Client

    wanted = set(args.only or ())
    wanted |= {r.reference for r in rows() if r.name in wanted and r.reference}
    chosen = [
        r
        for r in rows()
        if (not wanted or r.name in wanted) and (not args.stacks or r.stack in args.stacks)
    ]
    results: list[dict[str, Any]] = []
    with servers(keep=args.keep) as sv:
        client = await Client.connect(sv.temporal_address, namespace="default")
        for name, env in STACKS.items():
            mine = [r for r in chosen if r.stack == name]
            if not mine:
                continue
            if not any("{fake}" in v for v in env.values()):
                results += await run_stack(name, mine, args, sv, client)
                continue
            fake, root = await start_fake(sv)
            try:
                results += await run_stack(name, mine, args, sv, client, root)
            finally:
                fake.stop()
    order = [r.name for r in chosen]
    return deltas(medians(sorted(results, key=lambda r: order.index(r["feature"]))))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.feature_costs", description=__doc__)
    p.add_argument("--jobs", type=int, default=96, help="jobs per row (96: 6 per user)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of every row (3)")
    p.add_argument("--warmup", type=int, default=16, help="warm-up jobs per row (16)")
    p.add_argument("--concurrency", type=int, default=16, help="creates in flight (16)")
    p.add_argument("--interactive-concurrency", type=int, default=4, help="worker slots (4)")
    p.add_argument("--settle", type=float, default=2.0, help="seconds after the last end (2)")
    p.add_argument("--idle-seconds", type=float, default=60.0, help="idle probe (60)")
    p.add_argument("--timeout", type=float, default=300.0, help="per row (300 s)")
    p.add_argument("--only", nargs="*", help="row names (and their references)")
    p.add_argument("--stacks", nargs="*", choices=list(STACKS), help="only these stacks' rows")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (data and logs)")
    p.add_argument("--output", default="bench/results/feature_costs.json", help="JSON file")
    args = p.parse_args(argv)
    results = asyncio.run(run(args))
    print(table(results))
    Path(args.output).write_text(json.dumps(results, indent=2, default=str))
    print(f"figures in {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
