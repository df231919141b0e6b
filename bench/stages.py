"""`python -m bench.stages`: each job stage's own CPU per job, outside Temporal.

The stage activities (prepare, resolve, execute, project, complete) run in this process through
the SDK's `ActivityEnvironment` against a real PostgreSQL (embedded, or DATABASE_URL), one job
after another, on synthetic jobs created through the job service. Per stage it reports this
process's CPU per call (`time.process_time`) and PostgreSQL's backend CPU is left out. No
Temporal server, no workflow, no relay: it isolates what the throughput figure's engine worker
spends in the stages' own code, SQL and driver, with little noise, so a lever on a stage's
statements can be measured in seconds. Rounds alternate with the stages in the same order each
time; the median round is printed.

    .venv/bin/python -m bench.stages --jobs 300 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bench.scratch_db import scratch_database

if TYPE_CHECKING:
    from activities.stages import JobActivities
    from jobs.service import JobService

STAGES = ("prepare", "resolve", "execute", "project", "complete")


async def measure(url: str, jobs: int, rounds: int) -> dict[str, list[float]]:
    from activities.stages import JobActivities
    from db.credentials import active_user_key_id
    from engine.settings import Settings
    from jobs.service import JobService
    from runtime.wiring import build_parts, create_policy, engine_config, gateway

    settings = Settings.model_validate(
        {
            "DATABASE_URL": url,
            "AIJOBS_ENV": "test",
            "QUOTA_MAX_ACTIVE_JOBS": 0,
            "QUOTA_MAX_JOBS_PER_DAY": 0,
            "DB_POOL_SIZE": 4,
        }
    )
    parts = build_parts(settings)
    svc = JobService(
        parts.sessionmaker,
        parts.catalog,
        create_policy(settings),
        credential_lookup=active_user_key_id,
    )
    gw = gateway(settings, None)
    acts = JobActivities(parts.sessionmaker, parts.catalog, gw, engine_config(settings))
    per_stage: dict[str, list[float]] = {s: [] for s in STAGES}
    try:
        for _ in range(rounds + 1):  # the first round warms up (prepared statements, caches)
            ids = await _create_jobs(svc, jobs)
            spent = dict.fromkeys(STAGES, 0.0)
            for job_id in ids:
                await _run_stages(acts, str(job_id), spent)
            for s in STAGES:
                per_stage[s].append(spent[s] / jobs)
    finally:
        await gw.aclose()
        await parts.close()
    return {s: v[1:] for s, v in per_stage.items()}


async def _create_jobs(svc: JobService, jobs: int) -> list[Any]:
    """`jobs` synthetic jobs through the job service, over 16 users."""
    from jobs.service import CreateJobRequest

    ids = []
    for i in range(jobs):
        req = CreateJobRequest(
            user_id=f"bench-{i % 16}",
            job_type="synthetic",
            target_type="bench",
            target_id=uuid.uuid4().hex,
            input={},
        )
        ids.append((await svc.create(req)).job.id)
    return ids


async def _run_stages(acts: JobActivities, jid: str, spent: dict[str, float]) -> None:
    """The five stages of one job in order, each one's CPU time added to `spent`."""
    from temporalio.testing import ActivityEnvironment

    from engine.contracts import (
        CompleteInput,
        CompleteResult,
        ExecuteInput,
        ProjectInput,
        StageInput,
        workflow_id,
    )

    wid = workflow_id("ai-interactive", "synthetic", jid)
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        workflow_id=wid,
        workflow_type="synthetic",
        activity_type="execute",
        attempt=1,
        heartbeat_timeout=None,
    )
    for name, fn in (("prepare", acts.prepare), ("resolve", acts.resolve)):
        t = time.process_time()
        await env.run(fn, StageInput(jid, wid))
        spent[name] += time.process_time() - t
    t = time.process_time()
    ex = await env.run(acts.execute, ExecuteInput(jid, 30_000, "retry"))
    spent["execute"] += time.process_time() - t
    t = time.process_time()
    pr = await env.run(acts.project, ProjectInput(jid, ex.output_hash))
    spent["project"] += time.process_time() - t
    assert pr.lifecycle_status == "succeeded", pr
    t = time.process_time()
    usage = CompleteResult(pr.calls, pr.tokens_in, pr.tokens_out, pr.cost_micros)
    await env.run(acts.complete, CompleteInput(jid, usage if pr.summarized else None))
    spent["complete"] += time.process_time() - t


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.stages")
    p.add_argument("--jobs", type=int, default=300, help="jobs per round")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up")
    args = p.parse_args(argv)
    with scratch_database("aijobs-stages-") as url:
        res = asyncio.run(measure(url, args.jobs, args.rounds))
    total = [sum(r) for r in zip(*res.values(), strict=True)]
    print("| stage | CPU µs per job (median of rounds) | per round |\n|---|---:|---|")
    for s, v in res.items():
        print(
            f"| {s} | {1e6 * statistics.median(v):.0f} | {', '.join(f'{1e6 * x:.0f}' for x in v)} |"
        )
    print(
        f"| all five | {1e6 * statistics.median(total):.0f} | "
        f"{', '.join(f'{1e6 * x:.0f}' for x in total)} |"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
