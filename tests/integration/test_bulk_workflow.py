"""A bulk operation acts on each frozen job exactly once, whatever retries: racing attempts on
one item, a page retried after its worker stopped, a workflow long enough to continue as new;
and its Temporal history stays bounded. Real PostgreSQL, real Temporal, in-process workers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from db import bulk as bulk_db
from db.jobs import JobFilter
from db.session import SessionMaker
from engine.contracts import BULK_WORKFLOW, BulkInput, BulkResult
from engine.definition import SYSTEM_QUEUE
from engine.settings import Settings
from jobs.bulk import BulkPolicy, BulkService
from tests.integration.engine_helpers import (
    make_failed_jobs,
    retries_of,
    rows,
    wait_workflow_closed,
)
from tests.stack import Stack, engine_stack
from tests.support import eventually
from workflows.bulk import PAGES_PER_RUN

SYSTEM = (SYSTEM_QUEUE,)


@pytest.fixture
async def system(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> AsyncIterator[Stack]:
    async with engine_stack(settings, temporal_client, queues=SYSTEM, relay=False) as st:
        yield st


def service(st: Stack, **policy: float) -> BulkService:
    return BulkService(st.parts.sessionmaker, st.service, BulkPolicy(**policy))  # type: ignore[arg-type]


async def start(st: Stack, bulk: BulkService, op: bulk_db.OperationRow, **inp: object) -> str:
    base = bulk.workflow_input(op)
    await st.client.start_workflow(
        BULK_WORKFLOW,
        BulkInput(**{**base.__dict__, **inp}),
        id=op.workflow_id,
        task_queue=st.settings.task_queue(SYSTEM_QUEUE),
    )
    return op.workflow_id


async def item_states(db: SessionMaker, op: uuid.UUID) -> dict[str, int]:
    got = await rows(
        db,
        "SELECT state, count(*) AS n FROM bulk_operation_item WHERE operation_id = :op "
        "GROUP BY state",
        op=op,
    )
    return {r.state: int(r.n) for r in got}


async def test_racing_attempts_on_the_same_items_retry_each_job_once(
    system: Stack, db: SessionMaker
) -> None:
    failed = await make_failed_jobs(system.service, db, 30)
    bulk = service(system)
    f = JobFilter(status="failed")
    op = (await bulk.submit("root", "retry", f, {"status": "failed"})).operation
    items = await bulk.pending_page(op.id, after=0, limit=100)
    assert len(items) == 30
    # Three "attempts" of the same page at once (an activity retried while its first attempt
    # still runs), on real concurrent connections.
    results = await asyncio.gather(
        *(bulk.act(op.id, "retry", item) for item in items for _ in range(3))
    )
    assert results.count("done") == 30, results
    assert await retries_of(db, failed) == dict.fromkeys(failed, 1)
    assert await item_states(db, op.id) == {"done": 30}
    # A later attempt finds nothing pending.
    assert await bulk.pending_page(op.id, after=0, limit=100) == []


async def test_a_long_operation_continues_as_new_with_a_bounded_history(
    system: Stack, db: SessionMaker
) -> None:
    jobs = [await system.create("u1") for _ in range(PAGES_PER_RUN + 10)]
    bulk = service(system, page_size=1, jobs_per_second=10_000)
    op = (await bulk.submit("root", "cancel", JobFilter(user_id="u1"), {"userId": "u1"})).operation
    assert op.matched == len(jobs)
    wid = await start(system, bulk, op)
    handle = system.client.get_workflow_handle(wid, result_type=BulkResult)
    result = await handle.result()
    assert (result.done, result.skipped, result.failed) == (len(jobs), 0, 0)
    desc = await handle.describe()
    first_run_id = desc.raw_description.workflow_execution_info.first_run_id
    assert first_run_id != desc.run_id, "the operation never continued as new"
    first = [
        e.event_type
        async for e in system.client.get_workflow_handle(
            wid, run_id=first_run_id
        ).fetch_history_events()
    ]
    last = [e.event_type async for e in handle.fetch_history_events()]
    # A run holds at most PAGES_PER_RUN activities (about 6 events each) whatever the size.
    assert first[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    assert first.count(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED) == PAGES_PER_RUN
    assert len(first) <= 6 * PAGES_PER_RUN + 10, len(first)
    # The last 10 items, one page each, then the finish: no empty page at the end.
    assert last.count(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED) == 10 + 1
    got = await rows(db, "SELECT lifecycle_status FROM ai_job WHERE id = ANY(:ids)", ids=jobs)
    assert {r.lifecycle_status for r in got} == {"cancelled"}
    assert (await bulk.status(op.id)).operation.status == "completed"


async def test_a_page_interrupted_by_a_worker_stop_resumes_without_acting_twice(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client, queues=SYSTEM, relay=False) as first:
        failed = await make_failed_jobs(first.service, db, 40)
        bulk = service(first, page_size=40, jobs_per_second=20)
        op = (await bulk.submit("root", "retry", JobFilter(status="failed"), {})).operation
        wid = await start(first, bulk, op)

        async def some_done() -> bool:
            return (await item_states(db, op.id)).get("done", 0) >= 5

        await eventually(some_done, timeout=20, what="the first items of the page")
    # The worker stopped mid-page (its activity cancelled); a new worker takes the page over.
    partial = await item_states(db, op.id)
    assert 0 < partial.get("done", 0) < 40, partial
    async with engine_stack(settings, temporal_client, queues=SYSTEM, relay=False):
        await wait_workflow_closed(temporal_client, wid, timeout=30)
    assert await item_states(db, op.id) == {"done": 40}
    assert await retries_of(db, failed) == dict.fromkeys(failed, 1)
    history = [
        e.event_type async for e in temporal_client.get_workflow_handle(wid).fetch_history_events()
    ]
    assert history.count(EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED) >= 2
