"""Helpers for the engine integration tests, shared by the `test_engine_*`, relay,
crash/reconcile and privacy modules (the stack itself is `tests.stack.engine_stack`).

- `new_job`, `insert_job`: a queued job of the synthetic type, created by the lifecycle repository;
  `make_failed_jobs`: jobs a provider outage failed; `retries_of`: the retries made of them;
- `worker_processes`, `start_worker`: real `aijobs worker` subprocesses, stopped at the end;
- `scripted_job_type`: a copy of the synthetic job type with another name and execution policy;
- waits on SQL and Temporal state, built on `tests.support.eventually`;
- small SQL readers for the facts the tests assert.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from db import endings as endings_db
from db import lifecycle as lifecycle_db
from db import pipeline
from db.lifecycle import NewJob
from db.session import SessionMaker
from engine import search_attributes
from engine.contracts import workflow_id
from engine.errors import public_message_for
from jobs.service import CreateJobRequest, JobService
from jobs.spec import AnyJobType, Artifact, Planner, ProjectionContext
from jobs.types import synthetic
from tests.stack import INTERACTIVE, TERMINAL, variant
from tests.support import eventually

JOB_ID_SA = search_attributes.JOB_ID
JOB_TYPE_SA = search_attributes.JOB_TYPE
LIFECYCLE_SA = search_attributes.LIFECYCLE_STATUS


# ---- jobs written straight to SQL ------------------------------------------------------------


def new_job(user_id: str = "u1") -> NewJob:
    job_id = uuid.uuid4()
    return NewJob(
        id=job_id,
        user_id=user_id,
        job_type="synthetic",
        target_type="test",
        target_id="t1",
        idempotency_key=None,
        request_fingerprint="f" * 64,
        queue_name=INTERACTIVE[0],
        priority=50,
        input={},
        credential_mode="platform_key",
        credential_id=None,
        prompt_version="v1",
        input_schema_version="synthetic.input.v1",
        output_schema_version="synthetic.output.v1",
        max_retry_count=1,
        workflow_id=workflow_id(INTERACTIVE[0], "synthetic", str(job_id)),
    )


async def insert_job(sm: SessionMaker, user_id: str = "u1") -> uuid.UUID:
    job = new_job(user_id)
    async with sm.begin() as s:
        await lifecycle_db.create(s, job)
    return job.id


async def mark_succeeded(s: AsyncSession, job_id: uuid.UUID, *, owner: str | None = None) -> None:
    """running → succeeded as the success ending sends it (jobs/lifecycle.py `succeed`): the CAS
    of db/endings.py pipelined in the caller's transaction, a miss raised through
    `mark_succeeded_missed` (`LockConflict`, `IllegalTransition`, `JobNotFound`)."""
    [cas] = await pipeline.in_session(s, [endings_db.mark_succeeded_statement(job_id, owner=owner)])
    if not cas:
        await endings_db.mark_succeeded_missed(s, job_id, owner=owner)


async def insert_artifacts(
    s: AsyncSession, job_id: uuid.UUID, artifacts: Sequence[tuple[str, str, int]]
) -> list[bool]:
    """(artifact type, artifact id, ordinal) rows written as the success ending writes them
    (db/endings.py `artifact_statements`, pipelined in the caller's transaction); whether each
    was new (a repeated one writes nothing)."""
    if not artifacts:
        return []
    written = await pipeline.in_session(s, endings_db.artifact_statements(job_id, artifacts))
    return [bool(rows) for rows in written]


OUTAGE = "PROVIDER_UNAVAILABLE"  # the code a provider outage fails a job with


async def make_failed_jobs(
    service: JobService,
    db: SessionMaker,
    n: int,
    *,
    users: Sequence[str] = ("alice", "bob", "carol"),
    code: str = OUTAGE,
) -> list[uuid.UUID]:
    """`n` synthetic jobs created through the service, then failed with `code` through the
    lifecycle repository (queued → running → failed, as a provider outage would leave them)."""
    ids = [
        (
            await service.create(
                CreateJobRequest(
                    user_id=users[i % len(users)],
                    job_type="synthetic",
                    target_type="lesson",
                    target_id=f"lesson-{i}",
                    input={"echo": {"n": i}},
                    internal=True,
                )
            )
        ).job.id
        for i in range(n)
    ]
    # One transaction per job, as a worker fails them: a relay's claim marks the jobs it
    # dispatches in one statement, so one transaction locking many jobs in another order
    # can deadlock with it.
    for job_id in ids:
        async with db.begin() as s:
            await lifecycle_db.lock(s, job_id, owner=f"outage-{job_id}", identity="test", ttl_s=60)
            await endings_db.mark_failed(
                s, job_id, code, public_message_for(code), "test: simulated outage"
            )
    return ids


async def retries_of(db: SessionMaker, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
    async with db() as s:
        rows = await s.execute(
            text(
                "SELECT retried_from_job_id AS orig, count(*) AS n FROM ai_job "
                "WHERE retried_from_job_id = ANY(:ids) GROUP BY retried_from_job_id"
            ),
            {"ids": list(ids)},
        )
        return {r.orig: int(r.n) for r in rows}


# ---- worker subprocesses (crash and restart tests) -------------------------------------------

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def worker_processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker subprocesses started by the test; whatever is left is stopped at the end."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "runtime.cli", "worker", "--queue", INTERACTIVE[0]],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


# ---- test-only job types -------------------------------------------------------------------


def scripted_job_type(
    name: str,
    *,
    timeout_ms: int = 30_000,
    max_retries: int = 1,
    backoff_ms: int = 1000,
    abort_strategy: Literal["fail", "retry"] = "retry",
    projection: Planner[Any] | None = None,
) -> AnyJobType:
    """The synthetic job type under another name, with its own execution policy and projector.

    Its workflow type is `name` and its jobs run on `ai-interactive`, like synthetic's."""
    jt = variant(
        synthetic.JOB,
        name,
        timeout_ms=timeout_ms,
        max_retries=max_retries,
        backoff_ms=backoff_ms,
        abort_strategy=abort_strategy,
    )
    return dataclasses.replace(jt, projection=projection) if projection else jt


async def project_in(
    s: AsyncSession, planner: Planner[Any], ctx: ProjectionContext, out: Any
) -> list[Artifact]:
    """`planner`'s projection of `out` written in `s`'s transaction (its writes, not the
    artifact rows); the artifacts it names."""
    planned = planner(ctx, out)
    if planned.writes:
        await pipeline.in_session(s, planned.writes)
    return planned.artifacts


# ---- waits ---------------------------------------------------------------------------------


async def describe_or_none(client: Client, wid: str) -> WorkflowExecutionDescription | None:
    try:
        return await client.get_workflow_handle(wid).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def wait_workflow_closed(
    client: Client, wid: str, timeout: float = 30.0
) -> WorkflowExecutionDescription:
    async def probe() -> WorkflowExecutionDescription | None:
        d = await describe_or_none(client, wid)
        return d if d is not None and d.status != WorkflowExecutionStatus.RUNNING else None

    return await eventually(probe, timeout=timeout, what=f"workflow {wid} to close", interval=0.1)


async def wait_activity_started(
    client: Client, wid: str, activity: str = "execute", timeout: float = 30.0
) -> WorkflowExecutionDescription:
    """Until `activity` is a pending activity of the workflow in state STARTED (a worker runs
    it). Local activities never show here; EXECUTE is a regular activity."""

    async def probe() -> WorkflowExecutionDescription | None:
        d = await describe_or_none(client, wid)
        if d is None:
            return None
        for pa in d.raw_description.pending_activities:
            if (
                pa.activity_type.name == activity
                and pa.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            ):
                return d
        return None

    return await eventually(
        probe, timeout=timeout, what=f"{activity} of {wid} to be started", interval=0.1
    )


async def wait_jobs(
    sm: SessionMaker, job_ids: Sequence[uuid.UUID], *statuses: str, timeout: float = 60.0
) -> dict[uuid.UUID, str]:
    """Poll SQL until every job is in one of `statuses` (default: terminal)."""
    wanted = list(statuses or TERMINAL)

    async def probe() -> dict[uuid.UUID, str] | None:
        got = {
            r.id: r.lifecycle_status
            for r in await rows(
                sm, "SELECT id, lifecycle_status FROM ai_job WHERE id = ANY(:ids)", ids=job_ids
            )
        }
        done = sum(1 for j in job_ids if got.get(j) in wanted)
        return got if done == len(job_ids) else None

    return await eventually(
        probe, timeout=timeout, what=f"{len(job_ids)} jobs to reach {wanted}", interval=0.2
    )


def workflow_canceller(client: Client) -> Callable[[str], Awaitable[None]]:
    """What the API passes to `JobService.cancel`: cancel the job's Temporal workflow."""

    async def cancel(wid: str) -> None:
        await client.get_workflow_handle(wid).cancel()

    return cancel


# ---- SQL readers ---------------------------------------------------------------------------


async def rows(sm: SessionMaker, sql: str, **params: Any) -> list[Any]:
    async with sm() as s:
        return list((await s.execute(text(sql), params)).all())


async def scalar(sm: SessionMaker, sql: str, **params: Any) -> Any:
    async with sm() as s:
        return (await s.execute(text(sql), params)).scalar_one()


async def execute(sm: SessionMaker, sql: str, **params: Any) -> int:
    async with sm.begin() as s:
        result = await s.execute(text(sql), params)
        # A DML statement's result is a CursorResult; the stub types it as a plain Result.
        return int(result.rowcount)  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True)
class JobFacts:
    """Everything a job left in PostgreSQL besides its own row."""

    artifacts: list[tuple[str, str]]  # (artifact_type, artifact_id)
    synthetic_results: list[tuple[str, str]]  # (id, output_hash)
    usage: list[tuple[int, str | None]]  # (attempt_no, error_code) in attempt order
    events: dict[str, int]  # outbox event_type -> rows for this job


async def job_facts(sm: SessionMaker, job_id: uuid.UUID) -> JobFacts:
    arts = await rows(
        sm,
        "SELECT artifact_type, artifact_id FROM ai_job_artifact WHERE job_id = :j ORDER BY id",
        j=job_id,
    )
    results = await rows(
        sm, "SELECT id, output_hash FROM synthetic_result WHERE job_id = :j", j=job_id
    )
    usage = await rows(
        sm,
        "SELECT attempt_no, error_code FROM ai_usage_log WHERE job_id = :j ORDER BY attempt_no, id",
        j=job_id,
    )
    events = await rows(
        sm,
        "SELECT event_type, count(*) AS n FROM outbox_event WHERE aggregate_id = :j "
        "GROUP BY event_type",
        j=str(job_id),
    )
    return JobFacts(
        artifacts=[(a.artifact_type, a.artifact_id) for a in arts],
        synthetic_results=[(str(r.id), r.output_hash) for r in results],
        usage=[(u.attempt_no, u.error_code) for u in usage],
        events={e.event_type: int(e.n) for e in events},
    )


# ---- Temporal history ----------------------------------------------------------------------


async def history_blobs(client: Client, wid: str) -> tuple[bytes, str]:
    """A workflow's full history as protobuf bytes (payload data verbatim) and as JSON."""
    h = await client.get_workflow_handle(wid).fetch_history()
    return History(events=h.events).SerializeToString(), h.to_json()


def stage_names(history: Any) -> list[str]:
    """The stages a job's history ran, in order, as the Temporal UI lists them: each local
    activity (a `core_local_activity` marker) and each regular activity once (its first
    scheduling; a retry is the same activity)."""
    names: list[str] = []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            attrs = e.marker_recorded_event_attributes
            if attrs.marker_name == "core_local_activity":
                data = json.loads(bytes(attrs.details["data"].payloads[0].data))
                names.append(str(data["activity_type"]))
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names.append(e.activity_task_scheduled_event_attributes.activity_type.name)
    return names


def local_stages(history: Any) -> list[str]:
    """The local activities (PostgreSQL-only stages) a history ran, in order."""
    return [
        json.loads(bytes(e.marker_recorded_event_attributes.details["data"].payloads[0].data))[
            "activity_type"
        ]
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    ]


async def relay_heartbeat(client: Client, wid: str) -> dict[str, Any] | None:
    """The heartbeat details of the pending relay activity of the running relay workflow `wid`
    (what the Temporal UI shows), or None while there are none."""
    desc = await describe_or_none(client, wid)
    if desc is None or desc.status != WorkflowExecutionStatus.RUNNING:
        return None
    for a in desc.raw_description.pending_activities:
        if "relay" in a.activity_type.name and a.heartbeat_details.payloads:
            details: dict[str, Any] = json.loads(a.heartbeat_details.payloads[0].data)
            return details
    return None
