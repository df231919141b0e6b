"""`python -m bench.bulk`: the wall time and the Temporal calls of one bulk retry of N failed jobs
(docs/benchmarks.md, "The bulk operation figure").

For each pace it seeds N failed synthetic jobs (created through the job service, failed through
the lifecycle repository, as a provider outage leaves them), submits a bulk retry of them
(`BulkService.submit`: the frozen items, the operation row, its audit entry), starts its
workflow as the API does, and waits for the result, with an in-process `ai-system` worker. It
then walks the workflow's runs (continue-as-new chain) and counts their history: events,
workflow tasks, activities. The retries it creates are enqueued through the outbox (no relay
runs here: the figure is the bulk operation's own cost, not the jobs').
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from db import endings as endings_db
from db import lifecycle as lifecycle_db
from db.jobs import JobFilter
from db.session import SessionMaker
from engine.contracts import BULK_WORKFLOW, BulkResult
from engine.definition import SYSTEM_QUEUE
from engine.settings import Settings
from jobs.bulk import BulkPolicy, BulkService
from jobs.service import CreateJobRequest, JobService


@dataclass(frozen=True)
class Figure:
    jobs: int
    jobs_per_second: float
    page_size: int
    submit_s: float
    wall_s: float
    done: int
    skipped: int
    runs: int
    history_events: int
    workflow_tasks: int
    activities: int


async def seed(service: JobService, sm: SessionMaker, n: int) -> None:
    ids = [
        (
            await service.create(
                CreateJobRequest(
                    user_id=f"bench-{i % 17}",
                    job_type="synthetic",
                    target_type="bench",
                    target_id=f"b-{i}",
                    input={"echo": {"n": i}},
                    internal=True,
                )
            )
        ).job.id
        for i in range(n)
    ]
    async with sm.begin() as s:
        for job_id in ids:
            await lifecycle_db.lock(s, job_id, owner=f"bench-{job_id}", identity="bench", ttl_s=60)
            await endings_db.mark_failed(s, job_id, "PROVIDER_UNAVAILABLE", "outage", "bench")


async def history(client: Client, wid: str, first_run_id: str) -> tuple[int, int, int, int]:
    """(runs, events, workflow tasks completed, activities scheduled) over the run chain."""
    runs = events = tasks = activities = 0
    run_id: str | None = first_run_id
    while run_id:
        runs += 1
        nxt: str | None = None
        async for e in client.get_workflow_handle(wid, run_id=run_id).fetch_history_events():
            events += 1
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                tasks += 1
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                activities += 1
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                nxt = e.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
        run_id = nxt
    return runs, events, tasks, activities


async def measure(settings: Settings, client: Client, n: int, rate: float, page: int) -> Figure:
    from runtime.wiring import build_parts, create_policy
    from runtime.worker import build_workers

    parts = build_parts(settings)
    sm = parts.sessionmaker
    try:
        async with sm.begin() as s:
            await s.execute(text("TRUNCATE ai_job_snapshot, outbox_event, ai_job CASCADE"))
        jobs = JobService(sm, parts.catalog, create_policy(settings))
        await seed(jobs, sm, n)
        bulk = BulkService(
            sm, jobs, BulkPolicy(max_jobs=max(n, 1), page_size=page, jobs_per_second=rate)
        )
        (worker,) = build_workers(client, parts, (SYSTEM_QUEUE,))
        async with worker:
            t0 = time.perf_counter()
            op = (await bulk.submit("bench", "retry", JobFilter(status="failed"), {})).operation
            t1 = time.perf_counter()
            handle = await client.start_workflow(
                BULK_WORKFLOW,
                bulk.workflow_input(op),
                id=op.workflow_id,
                task_queue=settings.task_queue(SYSTEM_QUEUE),
                result_type=BulkResult,
            )
            result = await handle.result()
            wall = time.perf_counter() - t0
        runs, events, tasks, activities = await history(
            client, op.workflow_id, handle.first_execution_run_id or handle.result_run_id or ""
        )
        return Figure(
            jobs=n,
            jobs_per_second=rate,
            page_size=page,
            submit_s=round(t1 - t0, 3),
            wall_s=round(wall, 2),
            done=result.done,
            skipped=result.skipped,
            runs=runs,
            history_events=events,
            workflow_tasks=tasks,
            activities=activities,
        )
    finally:
        await parts.close()


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench.infra import servers
    from bench.procs import progress

    figures: list[dict[str, Any]] = []
    with servers(keep=False) as sv:
        client = await Client.connect(sv.temporal_address, namespace="default")
        for rate in args.rates:
            settings = Settings.model_validate(
                {
                    "DATABASE_URL": sv.database_url,
                    "TEMPORAL_ADDRESS": sv.temporal_address,
                    "AIJOBS_ENV": "test",
                    "TASK_QUEUE_SUFFIX": f"-bench-bulk-{int(rate)}",
                    "QUOTA_MAX_ACTIVE_JOBS": 0,
                    "QUOTA_MAX_JOBS_PER_DAY": 0,
                }
            )
            progress(f"bulk: retry of {args.jobs} failed jobs at {rate} jobs/s")
            fig = await measure(settings, client, args.jobs, rate, args.page_size)
            progress(f"bulk: {fig}")
            figures.append(asdict(fig))
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.bulk", description="Time one bulk retry of N failed jobs."
    )
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument(
        "--rates",
        default="50,100000",
        help="comma-separated bulk paces in jobs a second (jobs/bulk.py JOBS_PER_SECOND is 50), "
        "one run each (50,100000)",
    )
    p.add_argument("--page-size", type=int, default=100)
    p.add_argument("--output", help="write the figures as JSON here")
    args = p.parse_args(argv)
    args.rates = [float(x) for x in args.rates.split(",") if x.strip()]
    figures = asyncio.run(run(args))
    print(json.dumps(figures, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(figures, indent=2))
    from bench.teardown import hard_exit

    hard_exit(0)


if __name__ == "__main__":
    main()
