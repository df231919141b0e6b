"""`python -m bench.claim_plan`: the relay's claim over a backlog, on tables with or without
statistics (docs/benchmarks.md, "A later pass").

A fresh embedded PostgreSQL (or DATABASE_URL, which must be disposable: its jobs and outbox are
truncated), migrated; per round, the jobs and outbox truncated, N jobs of U users created
through `JobService.create` (16 at a time), optionally ANALYZE, then `--claims` claims
(`db/relay.py` `claim`: window 4, limit 1,000), the jobs each one dispatched ended (cancelled
in SQL) before the next, so every claim has room to fill. Prints each claim's rows and
milliseconds. Run it on an older tree for the "before" rows.

    .venv/bin/python -m bench.claim_plan --jobs 800            # no statistics
    .venv/bin/python -m bench.claim_plan --jobs 3200 --analyze

`--drain K`: claims of K rows instead (window 4), the jobs each one dispatched run and ended
(two updates of their rows, as the engine's) before the next, until the backlog is empty; per
claim the milliseconds and the shared buffers its statement read (EXPLAIN ANALYZE, rolled
back, of the same claim just before it is made): the relay draining a burst.

    .venv/bin/python -m bench.claim_plan --jobs 500 --drain 16 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import text

from bench.scratch_db import scratch_database

_TRUNCATE = text("TRUNCATE ai_job, outbox_event, ai_job_snapshot CASCADE")
# Ends the jobs the last claim dispatched, so the next claim has room (the legacy status too).
# The drain: the dispatched jobs' rows published, the jobs run, then ended.
_RUN_DISPATCHED = (
    text(
        "UPDATE outbox_event SET status = 'published', published_at = now() "
        "WHERE status = 'processing'"
    ),
    text(
        "UPDATE ai_job SET lifecycle_status = 'running', status = 'processing', "
        "locked_by = 'claim-plan', updated_at = now() "
        "WHERE dispatched_at IS NOT NULL AND lifecycle_status = 'queued'"
    ),
    text(
        "UPDATE ai_job SET lifecycle_status = 'succeeded', status = 'completed', "
        "finished_at = now(), updated_at = now() WHERE lifecycle_status = 'running'"
    ),
)
_END_DISPATCHED = text(
    "UPDATE ai_job SET lifecycle_status = 'cancelled', status = 'cancelled', "
    "finished_at = now() WHERE dispatched_at IS NOT NULL AND lifecycle_status = 'queued'"
)


async def measure(url: str, args: argparse.Namespace) -> list[list[tuple[int, float, int]]]:
    from bench.figures import _request
    from db import relay as relay_db
    from db.credentials import active_user_key_id
    from engine.settings import Settings
    from jobs.service import JobService
    from runtime.wiring import build_parts, create_policy

    settings = Settings.model_validate(
        {
            "DATABASE_URL": url,
            "AIJOBS_ENV": "test",
            "QUOTA_MAX_ACTIVE_JOBS": 0,
            "QUOTA_MAX_JOBS_PER_DAY": 0,
        }
    )
    parts = build_parts(settings)
    sm = parts.sessionmaker
    svc = JobService(
        sm, parts.catalog, create_policy(settings), credential_lookup=active_user_key_id
    )
    rounds: list[list[tuple[int, float, int]]] = []
    sem = asyncio.Semaphore(16)

    async def one(i: int, r: int) -> None:
        async with sem:
            req = _request(f"claim-plan-{r}", i)
            await svc.create(dataclasses.replace(req, user_id=f"u{i % args.users}"))

    for r in range(args.rounds):
        async with sm.begin() as s:
            await s.execute(_TRUNCATE)

        await asyncio.gather(*(one(i, r) for i in range(args.jobs)))
        if args.analyze:
            async with sm.begin() as s:
                await s.execute(text("ANALYZE ai_job, outbox_event"))
        claims: list[tuple[int, float, int]] = []
        limit = args.drain or 1000
        for _ in range(args.claims if not args.drain else args.jobs):
            buffers = (await explain_claim(sm, limit))[0] if args.drain else 0
            t = time.perf_counter()
            got = await relay_db.claim(sm, owner="claim-plan", limit=limit, window=4)
            claims.append((len(got), 1e3 * (time.perf_counter() - t), buffers))
            if args.drain and not got:
                break
            async with sm.begin() as s:
                for statement in _RUN_DISPATCHED if args.drain else ():
                    await s.execute(statement)
                await s.execute(_END_DISPATCHED)
        rounds.append(claims)
    return rounds


def _indexes(node: dict[str, Any]) -> set[str]:
    """The indexes a plan node and the nodes under it read."""
    found = {node["Index Name"]} if "Index Name" in node else set()
    for child in node.get("Plans", ()):
        found |= _indexes(child)
    return found


async def explain_claim(sm: Any, limit: int, window: int = 4) -> tuple[int, int, set[str]]:
    """What the claim's statement does now, from EXPLAIN ANALYZE in a transaction rolled back:
    (shared buffers it read, rows it claimed, the indexes it read). Also the claim-plan tests'
    measure (tests/integration/window_helpers.py)."""
    from db import relay as relay_db

    async with sm() as s, s.begin():
        plan = (
            await s.execute(
                text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + relay_db.CLAIM.text),
                {"lim": limit, "owner": "claim-plan", "window": window},
            )
        ).scalar_one()
        await s.rollback()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    blocks = int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])
    return blocks, int(top["Actual Rows"]), _indexes(top)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.claim_plan", description=__doc__)
    p.add_argument("--jobs", type=int, default=800, help="waiting jobs (800)")
    p.add_argument("--users", type=int, default=64, help="their users (64)")
    p.add_argument("--claims", type=int, default=3, help="claims per round (3)")
    p.add_argument("--rounds", type=int, default=2, help="rounds (2)")
    p.add_argument("--analyze", action="store_true", help="ANALYZE before the claims")
    p.add_argument("--drain", type=int, default=0, help="claims of this many rows until empty")
    args = p.parse_args(argv)
    with scratch_database("aijobs-claim-plan-") as url:
        rounds = asyncio.run(measure(url, args))
    stats = "analyzed" if args.analyze else "no statistics"
    print(f"| round | claims ({args.jobs} waiting jobs of {args.users} users, {stats}) |")
    print("|---|---|")
    for i, claims in enumerate(rounds, 1):
        if args.drain:
            drained = [c for c in claims if c[0]]
            ms = sum(c[1] for c in drained) / max(1, len(drained))
            worst = max((c[2] for c in drained), default=0)
            print(
                f"| {i} | {len(drained)} claims of {args.drain}: mean {ms:.1f} ms, "
                f"most buffers read by one {worst:,} |"
            )
            continue
        print(f"| {i} | " + ", ".join(f"{n} rows in {ms:.1f} ms" for n, ms, _ in claims) + " |")


if __name__ == "__main__":
    main()
