"""The bulk operation's activities (queue `ai-system`): act on one page of pending items,
paced, and close the operation.

A page is at most `page_size` items and at most `jobs_per_second` of them per second, so a bulk
retry of thousands of failed jobs enters the job queues as a steady trickle instead of a wave.
The activity heartbeats before every item: a page whose worker died is retried within the
heartbeat timeout, and its retry skips the items already settled (each item leaves `pending`
once, in the transaction that acts on its job). A bulk retry's items the owners' quotas or
budgets refuse are settled `refused` here (jobs/bulk.py), unless the operation overrides them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.client import Client

from engine.contracts import (
    BULK_FINISH,
    BULK_PROCESS_PAGE,
    BulkPageInput,
    BulkPageResult,
    BulkResult,
)
from jobs.bulk import BulkService


class BulkActivities:
    def __init__(self, bulk: BulkService, client: Client) -> None:
        self._bulk = bulk
        self._client = client

    async def _cancel_workflow(self, workflow_id: str) -> None:
        await self._client.get_workflow_handle(workflow_id).cancel()

    @activity.defn(name=BULK_PROCESS_PAGE)
    async def process_page(self, inp: BulkPageInput) -> BulkPageResult:
        operation_id = uuid.UUID(inp.operation_id)
        if inp.after_ordinal == 0:
            # A worker runs it: the API's read no longer needs to start it.
            await self._bulk.mark_started(operation_id)
        # One item past the page tells whether another page follows (no empty last page).
        items = await self._bulk.pending_page(
            operation_id, after=inp.after_ordinal, limit=inp.page_size + 1
        )
        more = len(items) > inp.page_size
        items = items[: inp.page_size]
        # A bulk retry's budget override is the operation's, stored with it (not an input).
        override = inp.action == "retry" and await self._bulk.override_budget(operation_id)
        loop = asyncio.get_running_loop()
        interval = 1.0 / inp.jobs_per_second
        start = loop.time()
        for i, item in enumerate(items):
            if activity.is_worker_shutdown():
                # A stopping worker hands the rest of the page on at a clean point (the items
                # acted on are settled): the workflow's next page starts after the last one.
                last = items[i - 1].ordinal if i else inp.after_ordinal
                return BulkPageResult(last_ordinal=last, processed=i, more=True)
            # Pacing: item i is acted on no earlier than i / rate seconds into the page.
            delay = start + i * interval - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            activity.heartbeat(item.ordinal)
            await self._bulk.act(
                operation_id,
                inp.action,
                item,
                cancel_workflow=self._cancel_workflow,
                override_budget=override,
            )
        return BulkPageResult(
            last_ordinal=items[-1].ordinal if items else inp.after_ordinal,
            processed=len(items),
            more=more,
        )

    @activity.defn(name=BULK_FINISH)
    async def finish(self, operation_id: str) -> BulkResult:
        return await self._bulk.finish(uuid.UUID(operation_id))

    def all(self) -> list[Callable[..., Any]]:
        return [self.process_page, self.finish]
