"""The bulk operation workflow (queue `ai-system`, id `bulk:{operationId}`): pages through the
operation's frozen items until none is pending, then closes the operation.

Its history stays small whatever the size: one activity per page (100 items by default) and a
continue-as-new every PAGES_PER_RUN pages, so 10,000 items are about 100 activities over two
runs. Every item's effect is decided in PostgreSQL (a CAS per item), so a retried page, a
restarted worker or a replayed run never acts on a job twice.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

from workflows.stages import stub

with workflow.unsafe.imports_passed_through():
    from engine.contracts import (
        BULK_WORKFLOW,
        BulkInput,
        BulkPageInput,
        BulkPageResult,
        BulkResult,
    )

PAGES_PER_RUN = 50
# Database errors, a restarted PostgreSQL: keep trying (the items wait, pending).
_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,
)


# Typed stubs of its activities (as workflows/stages.py's; activities/bulk.py registers them).
@activity.defn
async def bulk_process_page(inp: BulkPageInput) -> BulkPageResult:
    stub()


@activity.defn
async def bulk_finish(operation_id: str) -> BulkResult:
    stub()


@workflow.defn(name=BULK_WORKFLOW)
class BulkWorkflow:
    @workflow.run
    async def run(self, inp: BulkInput) -> BulkResult:
        after = inp.after_ordinal
        # A page takes page_size / rate seconds of pacing plus its own database work.
        page_s = inp.page_size / inp.jobs_per_second
        for _ in range(PAGES_PER_RUN):
            page = await workflow.execute_activity(
                bulk_process_page,
                BulkPageInput(
                    operation_id=inp.operation_id,
                    action=inp.action,
                    after_ordinal=after,
                    page_size=inp.page_size,
                    jobs_per_second=inp.jobs_per_second,
                ),
                start_to_close_timeout=timedelta(seconds=120 + 2 * page_s),
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=_RETRY,
            )
            after = page.last_ordinal
            if not page.more:
                return await workflow.execute_activity(
                    bulk_finish,
                    inp.operation_id,
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=_RETRY,
                )
        workflow.continue_as_new(dataclasses.replace(inp, after_ordinal=after))
