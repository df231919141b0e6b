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
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import text

_TRUNCATE = text("TRUNCATE ai_job, outbox_event, ai_job_snapshot CASCADE")
# Ends the jobs the last claim dispatched, so the next claim has room (the legacy status too).
_END_DISPATCHED = text(
    "UPDATE ai_job SET lifecycle_status = 'cancelled', status = 'cancelled', "
    "finished_at = now() WHERE dispatched_at IS NOT NULL AND lifecycle_status = 'queued'"
)


async def measure(url: str, args: argparse.Namespace) -> list[list[tuple[int, float]]]:
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
    rounds: list[list[tuple[int, float]]] = []
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
        claims: list[tuple[int, float]] = []
        for _ in range(args.claims):
            t = time.perf_counter()
            got = await relay_db.claim(sm, owner="claim-plan", limit=1000, window=4)
            claims.append((len(got), 1e3 * (time.perf_counter() - t)))
            async with sm.begin() as s:
                await s.execute(_END_DISPATCHED)
        rounds.append(claims)
    return rounds


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.claim_plan", description=__doc__)
    p.add_argument("--jobs", type=int, default=800, help="waiting jobs (800)")
    p.add_argument("--users", type=int, default=64, help="their users (64)")
    p.add_argument("--claims", type=int, default=3, help="claims per round (3)")
    p.add_argument("--rounds", type=int, default=2, help="rounds (2)")
    p.add_argument("--analyze", action="store_true", help="ANALYZE before the claims")
    args = p.parse_args(argv)
    url = os.environ.get("DATABASE_URL")
    pg = None
    if not url:
        from db.migrate import upgrade
        from runtime.embedded import start_postgres

        base = Path(tempfile.mkdtemp(prefix="aijobs-claim-plan-"))
        base.chmod(0o755)
        pg = start_postgres(base / "pg")
        url = pg.uri
        upgrade(url)
    try:
        rounds = asyncio.run(measure(url, args))
    finally:
        if pg is not None:
            pg.stop()
    stats = "analyzed" if args.analyze else "no statistics"
    print(f"| round | claims ({args.jobs} waiting jobs of {args.users} users, {stats}) |")
    print("|---|---|")
    for i, claims in enumerate(rounds, 1):
        print(f"| {i} | " + ", ".join(f"{n} rows in {ms:.1f} ms" for n, ms in claims) + " |")


if __name__ == "__main__":
    main()
