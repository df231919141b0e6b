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

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from engine.contracts import (
        BULK_FINISH,
        BULK_PROCESS_PAGE,
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


@workflow.defn(name=BULK_WORKFLOW)
class BulkWorkflow:
    @workflow.run
    async def run(self, inp: BulkInput) -> BulkResult:
        after = inp.after_ordinal
        # A page takes page_size / rate seconds of pacing plus its own database work.
        page_s = inp.page_size / inp.jobs_per_second
        for _ in range(PAGES_PER_RUN):
            page: BulkPageResult = await workflow.execute_activity(
                BULK_PROCESS_PAGE,
                BulkPageInput(
                    operation_id=inp.operation_id,
                    action=inp.action,
                    after_ordinal=after,
                    page_size=inp.page_size,
                    jobs_per_second=inp.jobs_per_second,
                ),
                result_type=BulkPageResult,
                start_to_close_timeout=timedelta(seconds=120 + 2 * page_s),
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=_RETRY,
            )
            after = page.last_ordinal
            if not page.more:
                result: BulkResult = await workflow.execute_activity(
                    BULK_FINISH,
                    inp.operation_id,
                    result_type=BulkResult,
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=_RETRY,
                )
                return result
        workflow.continue_as_new(dataclasses.replace(inp, after_ordinal=after))
