"""`python -m bench.reconcile`: the wall time and the Temporal calls of one reconciler pass over
a large backlog of healthy waiting jobs (docs/benchmarks.md, "The reconciler figure").

For each size N it seeds, by SQL in bulk, N `queued` jobs whose `ai.job.enqueue` row was
published minutes ago, starts one workflow per job under the job's own workflow id on a task
queue the bench owns and no worker polls (each stays open, waiting for its first workflow task,
exactly as a job waits when its queue has no free worker), and times one `Reconciler.run_once()`
with a cold cursor. Nothing in the pass should need repairing: the figure is what a pass costs
when everything is healthy, which is what every pass costs during a provider outage.

`--reconciler-ref <commit>` runs the reconciler module as it was at that commit instead (loaded
from `git show`), for the before/after comparison; it runs against the current schema and
repositories, which keep the functions the old module calls.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import subprocess
import sys
import time
import types
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from db.outbox import ENQUEUE
from db.session import SessionMaker

REPO = Path(__file__).resolve().parents[1]
START_CONCURRENCY = 64  # concurrent StartWorkflowExecution calls while seeding
SWEEP_MAX_PASSES = 20

_SEED_JOBS = text(
    """
    INSERT INTO ai_job (id, user_id, job_type, target_type, target_id, request_fingerprint,
                        lifecycle_status, status, queue_name, priority, progress, input,
                        credential_mode, prompt_version, input_schema_version,
                        output_schema_version, attempt_count, max_retry_count, workflow_id,
                        created_at, updated_at)
    SELECT g.id, 'seed-' || (g.n % 97), CAST(:job_type AS text), 'seed', 'seed-' || g.n,
           md5(g.id::text), 'queued', 'pending', CAST(:queue AS text), 50, 0, '{}'::jsonb,
           'platform_key', 'v1', 'v1', 'v1', 0, 1,
           CAST(:queue AS text) || ':' || CAST(:job_type AS text) || ':' || g.id,
           now() - make_interval(secs => :age) + g.n * interval '1 microsecond', now()
    FROM (SELECT n, gen_random_uuid() AS id FROM generate_series(1, :n) AS n) g
    RETURNING id, workflow_id
    """
)
_SEED_ENQUEUES = text(
    """
    INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload,
                              status, attempt_count, available_at, published_at, last_error,
                              created_at)
    SELECT CAST(:ev AS text), 'AiJob', j.id::text, CAST(:ev AS text) || ':' || j.id,
           jsonb_build_object('jobId', j.id::text, 'jobType', j.job_type,
                              'queueName', j.queue_name, 'priority', j.priority),
           CAST(:status AS text), CASE WHEN :status = 'dead' THEN 3 ELSE 1 END,
           now() - make_interval(secs => :age),
           CASE WHEN :status = 'published' THEN now() - make_interval(secs => :age) END,
           CASE WHEN :status = 'dead' THEN 'seeded: start failed' END,
           j.created_at
    FROM ai_job j WHERE j.id = ANY(:ids)
    ORDER BY j.created_at, j.id
    """
)


async def seed_waiting_jobs(
    sm: SessionMaker,
    n: int,
    *,
    enqueue_status: str = "published",
    age_s: float = 300.0,
    job_type: str = "synthetic",
    queue: str = "ai-interactive",
    end_as: str | None = None,
) -> list[tuple[uuid.UUID, str]]:
    """N `queued` jobs created `age_s` ago (in id order of their enqueue rows), each with its
    enqueue row in `enqueue_status` (published `age_s` ago, or parked as `dead` after 3
    attempts). `end_as="cancelled"` then ends them (queued → cancelled, as the cancel API does).
    Returns (job id, workflow id) in creation order. One transaction per 5,000 jobs."""
    out: list[tuple[uuid.UUID, str]] = []
    left = n
    while left > 0:
        k = min(left, 5_000)
        async with sm.begin() as s:
            made = [
                (r.id, r.workflow_id)
                for r in await s.execute(
                    _SEED_JOBS, {"n": k, "job_type": job_type, "queue": queue, "age": age_s}
                )
            ]
            ids = [j for j, _ in made]
            await s.execute(
                _SEED_ENQUEUES,
                {"ev": ENQUEUE, "status": enqueue_status, "age": age_s, "ids": ids},
            )
            if end_as is not None:
                await s.execute(
                    text(
                        "UPDATE ai_job SET lifecycle_status = :st, status = :st, "
                        "finished_at = now(), updated_at = now() WHERE id = ANY(:ids)"
                    ),
                    {"st": end_as, "ids": ids},
                )
        out.extend(sorted(made, key=lambda m: m[1]))
        left -= k
    return out


async def start_waiting_workflows(
    client: Client, workflow_ids: Sequence[str], task_queue: str
) -> float:
    """Start one workflow per id on `task_queue` (which no worker polls: each stays open, its
    first workflow task pending). Returns the seconds it took."""
    sem = asyncio.Semaphore(START_CONCURRENCY)
    t0 = time.monotonic()

    async def start(wid: str) -> None:
        async with sem:
            await client.start_workflow(
                "bench_waiting_job",
                id=wid,
                task_queue=task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            )

    await asyncio.gather(*(start(w) for w in workflow_ids))
    return time.monotonic() - t0


async def wait_visible(client: Client, task_queue: str, n: int, timeout_s: float = 300) -> None:
    """Until visibility lists the `n` open workflows of `task_queue` (it lags their starts; in
    production the reconciler only looks at enqueues published a minute ago)."""
    deadline = time.monotonic() + timeout_s
    query = f"TaskQueue = '{task_queue}' AND ExecutionStatus = 'Running'"
    while (await client.count_workflows(query)).count < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"visibility did not list {n} workflows of {task_queue}")
        await asyncio.sleep(0.5)


class CountingClient:
    """The real client, counting every Temporal RPC a reconciler makes through it (service
    calls, workflow starts, workflow handles): the figure's count of calls, independent of the
    reconciler's own counter (the old module has none)."""

    def __init__(self, real: Client) -> None:
        self._real = real
        self.calls = 0

    @property
    def namespace(self) -> str:
        return self._real.namespace

    @property
    def workflow_service(self) -> Any:
        return _CountingService(self, self._real.workflow_service)

    def get_workflow_handle(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1  # a handle is taken to send one RPC (a cancel)
        return self._real.get_workflow_handle(*args, **kwargs)

    async def start_workflow(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return await self._real.start_workflow(*args, **kwargs)


class _CountingService:
    def __init__(self, owner: CountingClient, service: Any) -> None:
        self._owner = owner
        self._service = service

    def __getattr__(self, name: str) -> Any:
        rpc = getattr(self._service, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self._owner.calls += 1
            return await rpc(*args, **kwargs)

        return call


@dataclass
class PassFigure:
    jobs: int
    reconciler: str  # "current" or the git ref
    wall_s: float
    temporal_calls: int  # counted by CountingClient
    reported_calls: int | None  # the reconciler's own count (None: the old module has none)
    workflows_described: int | None
    outbox_requeued: int
    stuck: int
    failed_phases: list[str]
    cut_short: list[str]
    start_s: float
    seed_s: float
    # Passes of the same reconciler (its cursor kept) until the waiting phase covered every job.
    sweep_passes: int
    sweep_wall_s: float
    sweep_temporal_calls: int


def load_reconciler(ref: str | None) -> types.ModuleType:
    """The reconciler module: the current one, or its source at git `ref`."""
    if ref is None:
        import activities.reconciler as current

        return current
    source = subprocess.run(
        ["git", "show", f"{ref}:activities/reconciler.py"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    name = f"_reconciler_at_{ref.replace('-', '_').replace('/', '_')}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(source, f"{ref}:activities/reconciler.py", "exec"), module.__dict__)
    return module


async def prepare(sm: SessionMaker, client: Client, n: int) -> tuple[float, float]:
    """Seed N healthy waiting jobs and start their workflows; (seed s, start s)."""
    t0 = time.monotonic()
    seeded = await seed_waiting_jobs(sm, n)
    seed_s = time.monotonic() - t0
    queue = f"bench-reconcile-{uuid.uuid4().hex[:8]}"
    start_s = await start_waiting_workflows(client, [w for _, w in seeded], queue)
    await wait_visible(client, queue, n)
    return seed_s, start_s


async def time_pass(
    sm: SessionMaker, client: Client, n: int, *, ref: str | None, prepared: tuple[float, float]
) -> PassFigure:
    """One pass of a fresh reconciler (cold cursor) over what `prepare` seeded."""
    mod = load_reconciler(ref)
    # No relay to manage; the missing-workflow guard as in production (the enqueues are 5 min
    # old, so every job is a candidate).
    cfg = mod.ReconcilerConfig()
    counting = CountingClient(client)
    rec = mod.Reconciler(sm, counting, cfg)
    t1 = time.monotonic()
    first = result = await rec.run_once()
    wall = time.monotonic() - t1
    first_calls = counting.calls
    # A capped pass leaves the rest to the next: passes until every waiting job was looked at.
    passes, sweep_wall = 1, wall
    while "waiting" in getattr(result, "phases_cut_short", []) and passes < SWEEP_MAX_PASSES:
        t2 = time.monotonic()
        result = await rec.run_once()
        sweep_wall += time.monotonic() - t2
        passes += 1
    return PassFigure(
        jobs=n,
        reconciler=ref or "current",
        wall_s=round(wall, 3),
        temporal_calls=first_calls,
        reported_calls=first.temporal_calls if ref is None else None,
        workflows_described=first.workflows_described if ref is None else None,
        outbox_requeued=first.outbox_requeued,
        stuck=first.stuck_workflows,
        failed_phases=list(getattr(first, "failed_phases", [])),
        cut_short=list(getattr(first, "phases_cut_short", [])),
        sweep_passes=passes,
        sweep_wall_s=round(sweep_wall, 3),
        sweep_temporal_calls=counting.calls,
        seed_s=round(prepared[0], 1),
        start_s=round(prepared[1], 1),
    )


async def measure_pass(sm: SessionMaker, client: Client, n: int) -> PassFigure:
    """Seed N healthy waiting jobs (on a clean `ai_job`/`outbox_event`) and time one pass of
    the current reconciler."""
    prepared = await prepare(sm, client, n)
    return await time_pass(sm, client, n, ref=None, prepared=prepared)


async def clear(sm: SessionMaker) -> None:
    async with sm.begin() as s:
        await s.execute(text("TRUNCATE ai_job_snapshot, outbox_event, ai_job CASCADE"))


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench.infra import servers
    from bench.procs import progress
    from db.session import make_engine, make_sessionmaker

    figures: list[dict[str, Any]] = []
    with servers(keep=False) as sv:
        client = await Client.connect(sv.temporal_address, namespace="default")
        engine = make_engine(sv.database_url, pool_size=8, max_overflow=8)
        sm = make_sessionmaker(engine)
        try:
            for n in args.jobs:
                await clear(sm)
                progress(f"reconcile: seeding {n} waiting jobs and starting their workflows")
                prepared = await prepare(sm, client, n)
                for ref in args.refs:
                    if ref is not None and n > args.old_max_jobs:
                        continue
                    progress(f"reconcile: one pass over {n} waiting jobs, {ref or 'current'}")
                    fig = await time_pass(sm, client, n, ref=ref, prepared=prepared)
                    progress(f"reconcile: {fig}")
                    figures.append(asdict(fig))
        finally:
            await engine.dispose()
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.reconcile",
        description="Time one reconciler pass over N healthy waiting jobs.",
    )
    p.add_argument(
        "--jobs",
        default="2000,20000",
        help="comma-separated backlog sizes, each measured on a clean database (2000,20000)",
    )
    p.add_argument(
        "--reconciler-ref",
        action="append",
        default=[],
        help="also measure the reconciler module as it was at this git ref (e.g. 5b19833, "
        "before bounded passes), on the same seeded jobs; repeatable",
    )
    p.add_argument(
        "--old-max-jobs",
        type=int,
        default=20_000,
        help="skip the --reconciler-ref passes above this size (20000)",
    )
    p.add_argument("--output", help="write the figures as JSON here")
    args = p.parse_args(argv)
    args.jobs = [int(x) for x in args.jobs.split(",") if x.strip()]
    args.refs = [None, *args.reconciler_ref]
    figures = asyncio.run(run(args))
    print(json.dumps(figures, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(figures, indent=2))
    from bench.teardown import hard_exit

    hard_exit(0)


if __name__ == "__main__":
    main()
