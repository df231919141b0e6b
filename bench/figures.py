"""One function per measured run. The phases (`bench/phases.py`) call them for the warm-up and
each repetition, interleaving engine and baseline so slow drift on a shared machine hits both.

How each figure is measured:
1. Throughput: N synthetic jobs created through `JobService.create` (the bench's own pool,
   bounded concurrency) while SQL is polled until all N are `succeeded`; jobs/s = N / (first
   create → poll sees N). Baselines (`bench/bare_workflows.py`): N bare workflows, one no-op
   activity or the engine's five-stage shape with no-op bodies, started by a plain client loop
   at the same concurrency, each awaited; jobs/s = N / (first start → last result). CPU per
   job: /proc/<pid>/stat of the worker processes (and relay, Temporal server, PostgreSQL)
   around each repetition, the idle rate subtracted from the engine's settle time.
2. Latency: jobs created open-loop at a fixed rate; per job `finished_at - created_at` from SQL.
3. Relay: jobs created one at a time, `gap` apart; commit = wall clock right after `create`
   returns, start = the WorkflowExecutionStarted event_time of the job's workflow history.
   Baseline: the client-side duration of a direct `start_workflow` RPC with the relay's options.
   Both again while 200 other jobs (`--relay-background`) run on the worker.
4. API: wrk (`bench/wrk.py`) against the real routes and the bare ones, same server process;
   the Python client (`bench/loadgen.py`) only when wrk is not installed.
5. PostgreSQL: `xact_commit` of the engine's database over each throughput repetition, minus the
   bench's own statements and the idle relay's polling; pgbench on the same server for the rate.
6. Scaling: throughput (1) with two worker processes on one task queue, and the CPU per job of
   each party (workers, relay, Temporal server, PostgreSQL) around each repetition.
7. Scale: list and quota queries on empty tables and on a seeded history (`bench/scale.py`).
8. Fairness: user B's 4 jobs behind user A's backlog, fairness on and off (`bench/fairness.py`).
9. Tracing: worker CPU per job with tracing off, sampled at 10 % and at 100 % (`bench/tracing.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryRequest
from temporalio.client import Client
from temporalio.common import (
    Priority,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)

from bench.bare_workflows import NOOP_WORKFLOW, SHAPE_WORKFLOW
from bench.infra import Admin, EngineDb, pgbench_path
from bench.procs import Proc, check_alive
from bench.stats import summary_ms
from engine import search_attributes
from engine.definition import priority_key
from jobs.service import CreateJobRequest, JobService

POLL_S = 0.05


@dataclass
class Ctx:
    client: Client
    svc: JobService
    edb: EngineDb
    admin: Admin
    concurrency: int
    watch: list[Proc]  # children whose death aborts the current run


def _request(tag: str, i: int) -> CreateJobRequest:
    return CreateJobRequest(
        user_id=f"bench-u{i % 64}",
        job_type="synthetic",
        target_type="bench",
        target_id=f"{tag}-{i}",
        input={},
    )


async def wait_succeeded(
    ctx: Ctx, n: int, t0: float, timeout_s: float, creating: asyncio.Future[Any] | None = None
) -> float:
    """Poll SQL until `n` jobs succeeded; the perf_counter time at which it saw them. A failed
    `creating` future (the creates still running) ends the wait with its error."""
    while True:
        if creating is not None and creating.done():
            failure = creating.exception()
            if failure is not None:
                raise failure
        ok, bad = await ctx.edb.status_counts()
        now = time.perf_counter()
        if bad:
            raise RuntimeError(f"{bad} job(s) ended failed/cancelled")
        if ok >= n:
            return now
        if now - t0 > timeout_s:
            raise TimeoutError(f"only {ok}/{n} jobs succeeded after {timeout_s:.0f}s")
        check_alive(ctx.watch)
        await asyncio.sleep(POLL_S)


# ---- 1 / 5 / 6: throughput ----------------------------------------------------------------


async def engine_throughput(ctx: Ctx, n: int, tag: str) -> dict[str, Any]:
    await ctx.edb.truncate()
    own0 = ctx.edb.commits
    sem = asyncio.Semaphore(ctx.concurrency)
    created_at: list[float] = []

    async def one(i: int) -> None:
        async with sem:
            await ctx.svc.create(_request(tag, i))

    wall0 = time.time()
    t0 = time.perf_counter()
    creating = asyncio.ensure_future(asyncio.gather(*(one(i) for i in range(n))))
    creating.add_done_callback(lambda _: created_at.append(time.perf_counter()))
    try:
        t1 = await wait_succeeded(ctx, n, t0, timeout_s=max(120.0, n / 2.0), creating=creating)
        await creating
    finally:
        if not creating.done():
            creating.cancel()
    rows = await ctx.edb.fetchall("SELECT extract(epoch FROM max(finished_at)) FROM ai_job")
    elapsed = t1 - t0
    return {
        "jobs": n,
        "elapsed_s": elapsed,
        "jobs_per_s": n / elapsed,
        "create_phase_s": created_at[0] - t0 if created_at else None,
        "sql_span_s": float(rows[0][0]) - wall0,  # first create -> last finished_at
        "own_commits": ctx.edb.commits - own0,  # bench statements during the run
    }


async def baseline_throughput(
    ctx: Ctx, queue: str, n: int, tag: str, *, shape: bool = False
) -> dict[str, Any]:
    """`shape`: the five-stage bare workflow (it takes the id, as a job workflow takes its job's);
    otherwise the one-activity one."""
    start_sem = asyncio.Semaphore(ctx.concurrency)
    # Results are awaited in start order with the same bound, so at most `concurrency`
    # long-polls are open; workflows finish roughly in start order, so none waits long.
    result_sem = asyncio.Semaphore(ctx.concurrency)
    run = uuid.uuid4().hex[:8]

    async def one(i: int) -> None:
        async with start_sem:
            if shape:
                wid = f"bench-shape-{tag}-{run}-{i}"
                h = await ctx.client.start_workflow(SHAPE_WORKFLOW, wid, id=wid, task_queue=queue)
            else:
                h = await ctx.client.start_workflow(
                    NOOP_WORKFLOW, id=f"bench-noop-{tag}-{run}-{i}", task_queue=queue
                )
        async with result_sem:
            await h.result()

    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=max(120.0, n / 2.0))
    finally:
        for t in tasks:
            t.cancel()
    t1 = time.perf_counter()
    return {"jobs": n, "elapsed_s": t1 - t0, "jobs_per_s": n / (t1 - t0)}


# ---- 2: latency at a fixed offered load ---------------------------------------------------


async def engine_latency(ctx: Ctx, rate: float, duration_s: float, tag: str) -> dict[str, Any]:
    await ctx.edb.truncate()
    n = max(1, round(rate * duration_s))
    tasks: list[asyncio.Future[Any]] = []
    max_lag = 0.0
    t0 = time.perf_counter() + 0.02
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            max_lag = max(max_lag, -delay)
        tasks.append(asyncio.ensure_future(ctx.svc.create(_request(tag, i))))
    offered_s = time.perf_counter() - t0
    await asyncio.gather(*tasks)
    await wait_succeeded(ctx, n, t0, timeout_s=duration_s + 120.0)
    rows = await ctx.edb.fetchall(
        "SELECT extract(epoch FROM finished_at - created_at) FROM ai_job "
        "WHERE lifecycle_status = 'succeeded'"
    )
    out: dict[str, Any] = summary_ms([float(r[0]) for r in rows])
    out.update(
        {
            "jobs": n,
            "offered_rate": n / offered_s if offered_s else None,
            "max_lag_ms": max_lag * 1e3,
        }
    )
    return out


# ---- 3: relay latency vs a direct start -----------------------------------------------------


async def _started_at(client: Client, wid: str) -> float:
    resp = await client.workflow_service.get_workflow_execution_history(
        GetWorkflowExecutionHistoryRequest(
            namespace=client.namespace,
            execution=WorkflowExecution(workflow_id=wid),
            maximum_page_size=1,
        )
    )
    ev = resp.history.events[0]
    assert ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
    return float(ev.event_time.ToNanoseconds()) / 1e9


# Each background job of the loaded relay figure holds a worker slot this long: 200 of them keep
# the worker busy (and their state changes coming) through a repetition's samples.
BACKGROUND_DELAY_MS = 100


async def background_jobs(ctx: Ctx, n: int, tag: str) -> None:
    """`n` jobs of 64 other users (none past its dispatch window), each holding a slot for
    `BACKGROUND_DELAY_MS`: while they run, jobs start, change and end all the time."""
    sem = asyncio.Semaphore(ctx.concurrency)

    async def one(i: int) -> None:
        async with sem:
            req = dataclasses.replace(
                _request(f"{tag}-bg", i),
                user_id=f"bench-bg{i % 64}",
                input={"delayMs": BACKGROUND_DELAY_MS},
            )
            await ctx.svc.create(req)

    await asyncio.gather(*(one(i) for i in range(n)))
    # Running: every one of them dispatched (its workflow started) before the samples begin.
    deadline = time.monotonic() + 120.0
    while True:
        rows = await ctx.edb.fetchall(
            "SELECT count(*) FROM outbox_event WHERE event_type = 'ai.job.enqueue' "
            "AND status <> 'published'"
        )
        if not rows[0][0]:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{rows[0][0]} background job(s) not dispatched after 120 s")
        check_alive(ctx.watch)
        await asyncio.sleep(POLL_S)


async def relay_latency(
    ctx: Ctx, count: int, gap_s: float, tag: str, *, background: int = 0
) -> dict[str, Any]:
    """`count` jobs created one at a time, `gap_s` apart; with `background`, while that many
    other jobs run."""
    await ctx.edb.truncate()
    t0 = time.perf_counter()
    if background:
        await background_jobs(ctx, background, tag)
    commits: list[tuple[str, float]] = []
    for i in range(count):
        res = await ctx.svc.create(_request(tag, i))
        commits.append((res.job.workflow_id, time.time()))
        await asyncio.sleep(gap_s)
    running = await ctx.edb.fetchall(
        "SELECT count(*) FROM ai_job WHERE lifecycle_status IN ('queued', 'running')"
    )
    await wait_succeeded(ctx, count + background, t0, timeout_s=120.0 + background / 2)
    lat = [await _started_at(ctx.client, wid) - tc for wid, tc in commits]
    out = summary_ms(lat)
    out["negative"] = sum(1 for x in lat if x < 0)  # started before `create` returned
    out["background"] = background
    out["still_running_after_samples"] = int(running[0][0]) - count if background else 0
    return out


async def direct_start_latency(
    ctx: Ctx, queue: str, count: int, gap_s: float, *, background: int = 0
) -> dict[str, Any]:
    """The relay's own start call (same options, search attributes, priority), timed; with
    `background`, while that many engine jobs run (as `relay_latency` has them)."""
    t0 = time.perf_counter()
    if background:
        await ctx.edb.truncate()
        await background_jobs(ctx, background, "direct")
    lat: list[float] = []
    for _ in range(count):
        job_id = str(uuid.uuid4())
        t = time.perf_counter()
        await ctx.client.start_workflow(
            NOOP_WORKFLOW,
            id=f"ai-interactive:bench_noop:{job_id}",
            task_queue=queue,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(search_attributes.JOB_ID, job_id),
                    SearchAttributePair(search_attributes.JOB_TYPE, "bench_noop"),
                    SearchAttributePair(search_attributes.LIFECYCLE_STATUS, "queued"),
                ]
            ),
            priority=Priority(priority_key=priority_key(50)),
        )
        lat.append(time.perf_counter() - t)
        await asyncio.sleep(gap_s)
    if background:
        await wait_succeeded(ctx, background, t0, timeout_s=120.0 + background / 2)
    return summary_ms(lat)


# ---- 5: pgbench -----------------------------------------------------------------------------

# The create transaction's three INSERTs with the engine's columns; `\gset` carries the new job's
# uuid into the other two. No colons inside literals: prepared mode would take them for variables.
_PGBENCH_SOURCE = r"""BEGIN;
INSERT INTO ai_job (id, user_id, job_type, target_type, target_id, idempotency_key,
  request_fingerprint, lifecycle_status, status, queue_name, priority, progress, input,
  credential_mode, credential_id, prompt_version, input_schema_version, output_schema_version,
  attempt_count, max_retry_count, workflow_id, retried_from_job_id, created_at, updated_at)
  VALUES (gen_random_uuid(), 'pgbench', 'synthetic', 'bench', 't1', NULL,
  'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855', 'queued', 'pending',
  'ai-interactive', 50, 0, '{}', 'platform_key', NULL, 'v1', 'synthetic.input.v1',
  'synthetic.output.v1', 0, 1, 'ai-interactive/synthetic', NULL, now(), now())
  RETURNING id AS jid \gset
INSERT INTO ai_job_snapshot (job_id, content, redaction_version, expires_at, created_at)
  VALUES (CAST(:jid AS uuid), '{"input": {}, "targetType": "bench", "targetId": "t1"}', 'v1',
  now() + make_interval(days => 30), now());
INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload, status,
  attempt_count, available_at, created_at)
  VALUES ('ai.job.enqueue', 'AiJob', CAST(:jid AS text), 'synthetic-pgbench-' || CAST(:jid AS text),
  jsonb_build_object('jobId', CAST(:jid AS text), 'jobType', 'synthetic',
  'queueName', 'ai-interactive', 'priority', 50), 'pending', 0, now(), now())
  ON CONFLICT (dedupe_key) DO NOTHING;
END;
"""


def pgbench_script_text() -> str:
    """One command per line, as pgbench requires (a line ending in `\\gset` ends its query)."""
    lines: list[str] = []
    buf: list[str] = []
    for raw in _PGBENCH_SOURCE.splitlines():
        buf.append(raw.strip())
        joined = " ".join(buf)
        if joined.endswith(";") or joined.endswith(r"\gset"):
            lines.append(joined)
            buf = []
    return "\n".join(lines) + "\n"


async def pgbench(
    socket_dir: str, database: str, script_path: str, *, seconds: int, clients: int, threads: int
) -> dict[str, Any]:
    cmd = [
        str(pgbench_path()),
        "-n",
        "-M",
        "prepared",
        "-c",
        str(clients),
        "-j",
        str(threads),
        "-T",
        str(seconds),
        "-h",
        socket_dir,
        "-U",
        "postgres",
        "-f",
        script_path,
        database,
    ]
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=seconds + 60)
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    text = out.decode(errors="replace")
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", text)
    failed = re.search(r"number of failed transactions: (\d+)", text)
    if proc.returncode != 0 or m is None:
        raise RuntimeError(f"pgbench failed ({proc.returncode}): {err.decode()[-800:]}")
    done = re.search(r"number of transactions actually processed: (\d+)", text)
    return {
        "tps": float(m.group(1)),
        "transactions": int(done.group(1)) if done else None,
        "failed": int(failed.group(1)) if failed else 0,
    }


__all__ = [
    "Ctx",
    "baseline_throughput",
    "direct_start_latency",
    "engine_latency",
    "engine_throughput",
    "pgbench",
    "pgbench_script_text",
    "relay_latency",
]
