"""The batch workflow (type `ai_batch`, id `ai-batch:{batch_id}`, on the jobs' task queue): one
per batch of the batch tier, started by the first enroll into it (activities/batch.py
`start_batch_workflow`).

It waits out the batch's window on a durable timer (AI_BATCH_WINDOW_S), submits the batch
(`batch_submit`: close, upload, create), then polls it on durable timers (AI_BATCH_POLL_S) with
`batch_poll` until it ended; `batch-poke` makes it poll (or submit) at once. No worker loops and
no slot is held while it waits; a worker restart only replays it. Its history holds ids,
statuses and counts only. A run continues as new after POLLS_PER_RUN polls, so a batch that
takes its whole 24 h keeps a short history.

Its activities are called through typed stubs (the activity runs under the stub's name, the
worker registers activities/batch.py's); this workflow's type is activities/batch.py's
constant, repeated here because a workflow imports no activity module
(tests/unit/test_batch_workflow.py checks they agree).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows.stages import stub

with workflow.unsafe.imports_passed_through():
    from engine.tiers import BATCH_POKE_SIGNAL

BATCH_WORKFLOW = "ai_batch"
POLLS_PER_RUN = 200
# The upload and create: a few attempts, then the activity fails the batch's items with the
# provider's code (its last attempt does, so each job retries in a later batch).
SUBMIT_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
)
# A poll that keeps failing is given up until the next timer: the batch runs on at the provider.
POLL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
)


@activity.defn
async def batch_timing() -> list[float]:
    """The batch's window and poll interval, in seconds (AI_BATCH_WINDOW_S, AI_BATCH_POLL_S)."""
    stub()


@activity.defn
async def batch_submit(batch_id: str) -> str:
    stub()


@activity.defn
async def batch_poll(batch_id: str) -> str:
    stub()


@workflow.defn(name=BATCH_WORKFLOW)
class BatchWorkflow:
    def __init__(self) -> None:
        self._poked = False

    @workflow.signal(name=BATCH_POKE_SIGNAL)
    def poke(self) -> None:
        """Poll (or submit) now instead of at the next timer."""
        self._poked = True

    async def _wait(self, seconds: float) -> None:
        """A durable timer of `seconds`, ended early by a poke."""
        try:
            await workflow.wait_condition(lambda: self._poked, timeout=timedelta(seconds=seconds))
        except TimeoutError:
            pass
        self._poked = False

    @workflow.run
    async def run(self, batch_id: str, submitted: bool = False) -> str:
        timing = await workflow.execute_local_activity(
            batch_timing, start_to_close_timeout=timedelta(seconds=10)
        )
        window_s, poll_s = timing
        if not submitted:
            await self._wait(window_s)
            status = await self._submit(batch_id, poll_s)
            if status != "submitted":
                return status
        for _ in range(POLLS_PER_RUN):
            await self._wait(poll_s)
            try:
                polled = await workflow.execute_activity(
                    batch_poll,
                    batch_id,
                    start_to_close_timeout=timedelta(minutes=5),
                    retry_policy=POLL_RETRY,
                )
            except ActivityError:
                continue  # the provider or the database is away: ask again at the next timer
            if polled != "submitted":
                return polled
        workflow.continue_as_new(args=[batch_id, True])

    async def _submit(self, batch_id: str, poll_s: float) -> str:
        """`batch_submit` until it answers (its own attempts are bounded; a failure of all of
        them that could not even fail the items, the database away, is tried again later)."""
        while True:
            try:
                return await workflow.execute_activity(
                    batch_submit,
                    batch_id,
                    start_to_close_timeout=timedelta(minutes=5),
                    retry_policy=SUBMIT_RETRY,
                )
            except ActivityError:
                await self._wait(poll_s)
