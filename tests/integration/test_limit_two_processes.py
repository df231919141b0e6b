"""A provider's concurrency limit is one limit across worker processes: it lives in PostgreSQL
(`provider_call_lease`, taken under the key's row lock), so two `aijobs worker` processes with
four slots each still make one call at a time under `concurrency: 1`, and the waits between
them are woken by each other's call ends (NOTIFY, any process's waker)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from db.session import SessionMaker
from tests.integration.engine_helpers import scalar
from tests.stack import engine_stack, make_settings

ROOT = Path(__file__).resolve().parents[2]
LIMITS = json.dumps({"synthetic": {"concurrency": 1}})


def worker_env(database_url: str, temporal_address: str, suffix: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "AIJOBS_ENV": "test",
        "LOG_LEVEL": "WARNING",
        "DATABASE_URL": database_url,
        "TEMPORAL_ADDRESS": temporal_address,
        "TASK_QUEUE_SUFFIX": suffix,
        "WORKER_METRICS_PORT": "0",
        "TEMPORAL_METRICS_PORT": "0",
        "QUOTA_MAX_ACTIVE_JOBS": "0",
        "QUOTA_MAX_JOBS_PER_DAY": "0",
        "AI_MODEL_LIMITS": LIMITS,
        "AI_INTERACTIVE_CONCURRENCY": "4",
        "WORKER_DRAIN_S": "0",
    }


async def execute_identities(client: Client, workflow_ids: list[str]) -> set[str]:
    """The worker identities that ran an EXECUTE of these runs (admitted or held back)."""
    seen: set[str] = set()
    for wid in workflow_ids:
        async for e in client.get_workflow_handle(wid).fetch_history_events():
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                seen.add(e.activity_task_started_event_attributes.identity)
    return seen


@pytest.mark.slow
async def test_two_worker_processes_never_overlap_calls_under_one_concurrency_limit(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    suffix = f"-t{uuid.uuid4().hex[:10]}"
    env = worker_env(database_url, temporal_address, suffix)
    argv = [sys.executable, "-m", "runtime.cli", "worker", "--queue", "ai-interactive"]
    procs = [subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL) for _ in range(2)]
    settings = make_settings(
        database_url, temporal_address, TASK_QUEUE_SUFFIX=suffix, AI_MODEL_LIMITS=LIMITS
    )
    try:
        # This test's stack only creates the jobs and relays them: the two processes run them.
        async with engine_stack(settings, temporal_client, queues=()) as st:
            jobs = [await st.create(user_id=f"u{i % 3}", input={"delayMs": 300}) for i in range(8)]
            rows = [await st.wait_status(j, timeout=90) for j in jobs]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    assert {r.lifecycle_status for r in rows} == {"succeeded"}, [r.error_code for r in rows]
    assert {r.attempt_count for r in rows} == {1}
    # Each call's span: its usage row is written after the call ended (`created_at`, the
    # settling transaction's start), `latency_ms` before that. The next call is admitted only
    # after that transaction released the lease, so the spans never overlap.
    async with db() as s:
        spans = (
            await s.execute(
                text(
                    "SELECT extract(epoch FROM created_at) - latency_ms / 1000.0 AS began, "
                    "extract(epoch FROM created_at) AS ended FROM ai_usage_log "
                    "ORDER BY created_at"
                )
            )
        ).all()
    assert len(spans) == 8
    for before, after in itertools.pairwise(spans):
        assert float(after.began) >= float(before.ended) - 0.001, (before, after)
    # Both processes took part (each ran EXECUTE for some of the jobs).
    ids = await execute_identities(temporal_client, [r.workflow_id for r in rows])
    assert len(ids) == 2, ids
    assert await scalar(db, "SELECT count(*) FROM provider_call_lease") == 0
