"""The queue table is the queues' configuration (engine/queues.py): a job type inherits its
queue's attempts, backoff and lock unless it overrides them, the built-in types keep the values
they had, the worker's concurrency per queue comes from the table, and what a real workflow
schedules (EXECUTE's retry policy and heartbeat timeout) and the SQL lock it takes follow it."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from db.session import SessionMaker
from engine.definition import Execution, JobDefinition, QueueSpec, RetryBackoff
from engine.queues import QUEUES, resolve_execution
from engine.settings import Settings
from jobs.spec import AnyJobType
from jobs.types import default_catalog, synthetic
from runtime.worker import queue_concurrency
from tests.integration.engine_helpers import wait_activity_started, workflow_canceller
from tests.stack import JOB_QUEUES, engine_stack, make_settings


def on_queue(name: str, queue: str, **execution: object) -> AnyJobType:
    """The synthetic type under another name on `queue`, with only `execution` set."""
    d = synthetic.DEFINITION.model_copy(
        update={
            "job_type": name,
            "queue": QueueSpec(queue_name=queue),
            "execution": Execution.model_validate({"timeout_ms": 30_000, **execution}),
        }
    )
    return dataclasses.replace(synthetic.JOB, definition=d)


# ---- the resolution (no engine) --------------------------------------------------------------


def test_the_specifications_queue_table() -> None:
    table = {q.name: (q.concurrency, q.lock_ms, q.attempts, q.backoff_ms) for q in QUEUES.values()}
    assert table == {
        "ai-interactive": (2, 30_000, 2, 2000),
        "ai-background": (1, 60_000, 3, 5000),
    }


@pytest.mark.parametrize(
    ("queue", "attempts", "backoff_ms", "heartbeat_ms", "lock_s"),
    [("ai-interactive", 2, 2000, 30_000, 30), ("ai-background", 3, 5000, 60_000, 60)],
)
def test_a_type_without_overrides_inherits_its_queues_values(
    queue: str, attempts: int, backoff_ms: int, heartbeat_ms: int, lock_s: int
) -> None:
    d = JobDefinition(job_type="plain_type", queue=QueueSpec(queue_name=queue))
    policy = resolve_execution(d)
    assert (policy.max_attempts, policy.backoff_ms) == (attempts, backoff_ms)
    assert (policy.heartbeat_timeout_ms, policy.lock_ttl_s) == (heartbeat_ms, lock_s)
    assert d.max_attempts == attempts


def test_a_types_own_values_win_then_the_operators_then_the_queues() -> None:
    own = JobDefinition(
        job_type="own_values",
        queue=QueueSpec(queue_name="ai-background"),
        execution=Execution(max_retries=0, retry_backoff=RetryBackoff(delay=700), lock_ms=9000),
    )
    policy = resolve_execution(own, heartbeat_timeout_ms=2000, lock_ttl_s=5)
    assert (policy.max_attempts, policy.backoff_ms) == (1, 700)
    assert (policy.heartbeat_timeout_ms, policy.lock_ttl_s) == (9000, 9)

    inherited = JobDefinition(job_type="inherits", queue=QueueSpec(queue_name="ai-background"))
    overridden = resolve_execution(inherited, heartbeat_timeout_ms=2000, lock_ttl_s=5)
    assert (overridden.heartbeat_timeout_ms, overridden.lock_ttl_s) == (2000, 5)
    assert (overridden.max_attempts, overridden.backoff_ms) == (3, 5000)  # not the lock's


def test_the_built_in_types_keep_their_attempts_and_backoff() -> None:
    expected = {
        "quiz_generation": (2, 2000),
        "flashcard_generation": (2, 2000),
        "synthetic": (2, 2000),
        "weak_point_analysis": (3, 5000),
    }
    catalog = default_catalog()
    got = {}
    for name in expected:
        policy = resolve_execution(catalog.get(name).definition)
        got[name] = (policy.max_attempts, policy.backoff_ms)
    assert got == expected


def test_the_workers_concurrency_comes_from_the_table_unless_overridden(
    database_url: str, temporal_address: str
) -> None:
    plain = make_settings(database_url, temporal_address)
    assert [queue_concurrency(plain, q) for q in JOB_QUEUES] == [2, 1]
    tuned = make_settings(
        database_url,
        temporal_address,
        AI_INTERACTIVE_CONCURRENCY=5,
        AI_BACKGROUND_CONCURRENCY=3,
    )
    assert [queue_concurrency(tuned, q) for q in JOB_QUEUES] == [5, 3]


# ---- what a real workflow schedules ------------------------------------------------------------


async def test_execute_is_scheduled_and_locked_with_its_queues_values(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """A new ai-background type that sets nothing gets 3 attempts, 5 s backoff and a 60 s
    heartbeat timeout and SQL lock; an interactive one 2, 2 s and 30 s."""
    background = on_queue("t_background_defaults", "ai-background")
    interactive = on_queue("t_interactive_defaults", "ai-interactive")
    async with engine_stack(
        settings, temporal_client, queues=JOB_QUEUES, extra_types=[background, interactive]
    ) as st:
        for jt, attempts, backoff_s, lock_s in (
            (background, 3, 5, 60),
            (interactive, 2, 2, 30),
        ):
            queue = jt.definition.queue.queue_name
            job_id = await st.create(job_type=jt.job_type, input={"hang": True})
            wid = st.workflow_id(job_id, jt.job_type, queue)
            await wait_activity_started(temporal_client, wid)
            history = await temporal_client.get_workflow_handle(wid).fetch_history()
            [scheduled] = [
                e.activity_task_scheduled_event_attributes
                for e in history.events
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            ]
            assert scheduled.retry_policy.maximum_attempts == attempts
            assert scheduled.retry_policy.initial_interval.ToTimedelta() == timedelta(
                seconds=backoff_s
            )
            assert scheduled.heartbeat_timeout.ToTimedelta() == timedelta(seconds=lock_s)
            row = await st.wait_status(job_id, "running")
            assert row.max_retry_count == attempts - 1
            ttl = (row.lock_until - row.locked_at).total_seconds()
            assert lock_s - 1 <= ttl <= lock_s + 1, ttl
            await st.service.cancel(job_id, "u1", cancel_workflow=workflow_canceller(st.client))
            assert (await st.wait_status(job_id)).lifecycle_status == "cancelled"
