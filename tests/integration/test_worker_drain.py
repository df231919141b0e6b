"""A worker process serving both job queues drains them at once: a stop takes the longest drain,
not their sum, and a queue whose worker is still draining another queue's calls takes no new
work meanwhile (a deploy would wait for it too)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

from temporalio.client import Client

from db.session import SessionMaker
from engine.definition import QueueSpec
from jobs.spec import AnyJobType
from jobs.types import synthetic
from runtime.worker import BACKGROUND_QUEUE, INTERACTIVE_QUEUE, run_workers
from tests.integration.engine_helpers import job_facts, wait_activity_started
from tests.stack import JOB_QUEUES, Stack, engine_stack, make_settings

CALL_MS = 4000


def on_background(base: AnyJobType, job_type: str) -> AnyJobType:
    d = base.definition
    queue = QueueSpec(queue_name=BACKGROUND_QUEUE)
    return dataclasses.replace(
        base, definition=d.model_copy(update={"job_type": job_type, "queue": queue})
    )


BACKGROUND = on_background(synthetic.JOB, "synthetic_background")


async def started(stack: Stack, job_type: str, queue: str) -> uuid.UUID:
    """A job whose provider call (CALL_MS) is in flight on `queue`."""
    job = await stack.create(job_type=job_type, input={"delayMs": CALL_MS})
    await wait_activity_started(stack.client, stack.workflow_id(job, job_type, queue))
    return job


async def test_a_multi_queue_worker_drains_its_queues_at_once(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    settings = make_settings(
        database_url,
        temporal_address,
        WORKER_DRAIN_S=60,  # far longer than any call here: nothing is cancelled
        AI_INTERACTIVE_CONCURRENCY=1,
        AI_BACKGROUND_CONCURRENCY=1,
    )
    async with engine_stack(
        settings, temporal_client, queues=(), extra_types=[BACKGROUND]
    ) as stack:
        stop = asyncio.Event()
        worker = asyncio.create_task(run_workers(temporal_client, stack.parts, JOB_QUEUES, stop))
        try:
            # One call in flight on each queue, and one more job waiting behind each.
            front = await started(stack, "synthetic", INTERACTIVE_QUEUE)
            back = await started(stack, BACKGROUND.job_type, BACKGROUND_QUEUE)
            waiting = [
                await stack.create(job_type=t, input={"delayMs": CALL_MS})
                for t in ("synthetic", BACKGROUND.job_type)
            ]
            t0 = time.monotonic()
            stop.set()  # SIGTERM, as `aijobs worker` installs it
            await asyncio.wait_for(asyncio.shield(worker), 60)
            took = time.monotonic() - t0
        finally:
            stop.set()
            await asyncio.wait_for(worker, 90)
        # Both in-flight calls finished and their answers were kept (no attempt thrown away):
        # the output is stored with its usage; project and complete wait for the next worker.
        for job in (front, back):
            row = await stack.job(job)
            assert row.attempt_count == 1 and row.output_hash is not None, row
            assert (await job_facts(db, job)).usage == [(1, None)]
        # ... within one call's time: neither queue went on taking work while the other drained.
        assert took < CALL_MS / 1000 + 1.5, f"stopping took {took:.1f} s"
        for job in waiting:
            row = await stack.job(job)
            assert (row.lifecycle_status, row.attempt_count) == ("queued", 0), row
        # The next worker finishes the drained jobs from their stored answers: no second call.
        stop = asyncio.Event()
        worker = asyncio.create_task(run_workers(temporal_client, stack.parts, JOB_QUEUES, stop))
        try:
            for job in (front, back):
                row = await stack.wait_status(job, timeout=30)
                assert (row.lifecycle_status, row.attempt_count) == ("succeeded", 1), row
                assert (await job_facts(db, job)).usage == [(1, None)]
        finally:
            stop.set()
            await asyncio.wait_for(worker, 90)
