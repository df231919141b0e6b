"""The queue table is the queues' configuration (engine/queues.py) on a real stack: the worker's
concurrency per queue comes from the table, and what a real workflow schedules (EXECUTE's retry
policy and heartbeat timeout) and the SQL lock it takes follow it. How a job type's values
resolve from the table without a server is tests/unit/test_queue_table.py."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from db.session import SessionMaker
from engine.definition import Execution, QueueSpec
from engine.settings import Settings
from jobs.spec import AnyJobType
from jobs.types import synthetic
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
    heartbeat timeout and SQL lock; an interactive one 2, 2 s and a 30 s heartbeat timeout
    with the specification's 60 s SQL lock."""
    background = on_queue("t_background_defaults", "ai-background")
    interactive = on_queue("t_interactive_defaults", "ai-interactive")
    async with engine_stack(
        settings, temporal_client, queues=JOB_QUEUES, extra_types=[background, interactive]
    ) as st:
        for jt, attempts, backoff_s, heartbeat_s, lock_s in (
            (background, 3, 5, 60, 60),
            (interactive, 2, 2, 30, 60),
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
            assert scheduled.heartbeat_timeout.ToTimedelta() == timedelta(seconds=heartbeat_s)
            row = await st.wait_status(job_id, "running")
            assert row.max_retry_count == attempts - 1
            ttl = (row.lock_until - row.locked_at).total_seconds()
            assert lock_s - 1 <= ttl <= lock_s + 1, ttl
            await st.service.cancel(job_id, "u1", cancel_workflow=workflow_canceller(st.client))
            assert (await st.wait_status(job_id)).lifecycle_status == "cancelled"
