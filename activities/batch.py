"""The batch workflow's activities (workflows/batch.py, on the jobs' task queue): the window's
close and the upload (`batch_submit`), and the poll that stores, charges and signals the
results (`batch_poll`); `start_batch_workflow` is what an enroll calls after its commit.

Only ids, statuses and counts cross Temporal: a batch's JSONL body and its answers live in
PostgreSQL (`ai_batch_item.body` / `response`) and in this process's memory while a request
is made. The key is the gateway's platform key and lives only in these activities' frames.

Each step is safe to retry: the close is a CAS (`open → submitting`, a retry re-reads the
pending items), an item's outcome is recorded once (its charge in the same transaction), and
the batch's end is written after its jobs were signalled (a crash between them signals again:
`batch-result` only tells a job to read its item, so a second one is harmless).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.batch_files import ClientFor, delete_due, gateway_clients
from activities.batch_results import (
    NO_ANSWER,
    BatchCharge,
    Results,
    batch_charge,
    usage_row,
)
from activities.batch_submit import Submission, Submitted
from activities.deps import StageDeps
from db import batch_files as files_db
from db import batch_results as results_db
from db import batch_uploads as uploads_db
from db import batches as batches_db
from db.batches import BatchRow, Enrolled
from engine.errors import ExecutionFailure, Retry, retry_rule
from engine.tiers import BATCH_POKE_SIGNAL, BATCH_RESULT_SIGNAL
from providers.batch import BatchClient, ProviderBatch

__all__ = [
    "NO_ANSWER",
    "BatchActivities",
    "BatchCharge",
    "BatchTiming",
    "batch_charge",
    "start_batch_workflow",
    "usage_row",
]

log = logging.getLogger("activities.batch")

BATCH_WORKFLOW = "ai_batch"
BATCH_TIMING = "batch_timing"
BATCH_SUBMIT = "batch_submit"
BATCH_POLL = "batch_poll"
# A submitted batch the provider still cannot be asked about this long after its submission
# (its 24 h window and a margin) fails its items: each job retries in a later batch. So does a
# submit whose create may have been sent but cannot be found or made for that long.
GIVE_UP_AFTER = timedelta(hours=25)


@dataclass(frozen=True)
class BatchTiming:
    """AI_BATCH_WINDOW_S (how long a batch gathers jobs) and AI_BATCH_POLL_S (how often a
    submitted batch is polled), read by each batch workflow run from its worker."""

    window_s: float = 60.0
    poll_s: float = 60.0


async def start_batch_workflow(client: Client, enrolled: Enrolled, task_queue: str) -> None:
    """Start the batch's workflow (`ai-batch:{batch_id}`) on the jobs' task queue, unless it
    was started already (running or ended: a batch's workflow runs once), and poke the
    workflows of the batches the enroll closed at a cap, so they submit without waiting out
    their window (started with the poke if their first enroll has not started them yet). Call
    it after the enroll committed; it is idempotent, so a retried enroll calls it again."""
    closed = {c.batch_id for c in enrolled.closed}
    for c in enrolled.closed:
        if c.batch_id != enrolled.batch_id:
            await _start(client, c.batch_id, c.workflow_id, task_queue, poke=True)
    await _start(
        client,
        enrolled.batch_id,
        enrolled.workflow_id,
        task_queue,
        poke=enrolled.batch_id in closed,
    )


async def _start(
    client: Client, batch_id: uuid.UUID, workflow_id: str, task_queue: str, *, poke: bool
) -> None:
    try:
        await client.start_workflow(
            BATCH_WORKFLOW,
            args=[str(batch_id), False],
            id=workflow_id,
            task_queue=task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            start_signal=BATCH_POKE_SIGNAL if poke else None,
        )
    except WorkflowAlreadyStartedError:
        pass


def _retryable_now(exc: ExecutionFailure) -> bool:
    """Whether this attempt's failure is left to the activity's retry policy: a code a retry
    may change, and attempts left."""
    info = activity.info()
    left = info.retry_policy is None or (
        info.retry_policy.maximum_attempts == 0 or info.attempt < info.retry_policy.maximum_attempts
    )
    return retry_rule(exc.code) is not Retry.NO and left


def _failure(exc: ExecutionFailure) -> ApplicationError:
    """The activity's failure: the code only (no provider text reaches Temporal)."""
    return ApplicationError(f"batch API failed: {exc.code}", type=exc.code)


class BatchActivities:
    """The batch workflow's activities of one job worker, built from the stages' `StageDeps`
    (the gateway's provider, HTTP client, platform key and prices) and the worker's client."""

    def __init__(self, deps: StageDeps, client: Client, timing: BatchTiming) -> None:
        self.deps = deps
        self.client = client
        self.timing_config = timing
        self.clients: ClientFor = gateway_clients(deps.gateway)

    def all(self) -> list[Any]:
        return [self.timing, self.submit, self.poll]

    def _batch_client(self, batch: BatchRow) -> BatchClient:
        """The batch endpoints of the batch's provider with the platform key: the one route a
        batch has (a user's own key is DeepSeek's, which has no batch API)."""
        client = self.clients(batch.provider, batch.key_ref)
        if client is None:
            raise ExecutionFailure(
                "PROVIDER_UNAVAILABLE", internal_message="no batch route for this batch's provider"
            )
        return client

    @activity.defn(name=BATCH_TIMING)
    async def timing(self) -> list[float]:
        return [self.timing_config.window_s, self.timing_config.poll_s]

    @activity.defn(name=BATCH_SUBMIT)
    async def submit(self, batch_id: str) -> str:
        """Close the batch's window, upload its lines as one JSONL file and create the batch at
        the provider, or adopt what an earlier attempt made there (activities/batch_submit.py).
        Returns the batch's status: `submitted`, or `cancelled` (no line left to send, no call
        made), or `failed` (the provider refused it for good, or kept failing until the last
        attempt while no create could have been sent: its items fail with the provider's
        code), or `expired` (a create that may have been sent could not be found for too
        long). A create whose outcome is unknown is never given up on before that: the
        attempt fails, and the next looks for the batch first."""
        bid = uuid.UUID(batch_id)
        async with self.deps.sessionmaker.begin() as s:
            batch = await batches_db.close(s, bid)
            up = await uploads_db.start_upload(s, bid)
        if batch is None or up is None:
            return "missing"
        if up.batch.status != "submitting":
            return up.batch.status
        submission: Submission | None = None
        try:
            submission = Submission(self.deps.sessionmaker, self._batch_client(up.batch), up)
            done = await submission.run()
        except ExecutionFailure as exc:
            return await self._submit_failed(up.batch, submission, exc)
        finally:
            if submission is not None and submission.orphans:
                await self._delete_files(bid)
        return await self._submitted(bid, done)

    async def _submitted(self, bid: uuid.UUID, done: Submitted) -> str:
        if done.batch is None or done.input_file_id is None:  # no line to send: no call
            async with self.deps.sessionmaker.begin() as s:
                await results_db.fail_items(s, bid, NO_ANSWER)
                await batches_db.end(s, bid, "cancelled")
            log.info("batch.empty", extra={"batch_id": str(bid)})
            return "cancelled"
        async with self.deps.sessionmaker.begin() as s:
            await batches_db.mark_submitted(
                s, bid, provider_batch_id=done.batch.id, input_file_id=done.input_file_id
            )
        log.info("batch.submitted", extra={"batch_id": str(bid)})
        return "submitted"

    async def _submit_failed(
        self, batch: BatchRow, submission: Submission | None, exc: ExecutionFailure
    ) -> str:
        """A failed submit attempt: left to the retry policy while it may succeed; a create
        whose outcome is unknown is never failed for good before GIVE_UP_AFTER (it may exist:
        failing its items would send their lines twice)."""
        unknown = retry_rule(exc.code) is not Retry.NO
        began = batch.upload_started_at or batch.created_at
        if unknown and submission is not None and submission.create_sent:
            if datetime.now(UTC) - began <= GIVE_UP_AFTER:
                raise _failure(exc) from None
            await self._fail(batch.id, NO_ANSWER, end="expired")
            return "expired"
        if _retryable_now(exc):
            raise _failure(exc) from None
        if submission is not None and not submission.create_sent:
            await self._sweep_uploads(submission)
        await self._fail(batch.id, exc.code)
        log.info("batch.submit_failed", extra={"batch_id": str(batch.id), "code": exc.code})
        return "failed"

    async def _sweep_uploads(self, submission: Submission) -> None:
        """A batch failed before any create: uploads of its file whose answers were lost are
        recorded (so they are deleted) when the provider can still list them."""
        try:
            found = await submission.uploads()
        except ExecutionFailure:
            return
        known = {submission.input_file_id}
        async with self.deps.sessionmaker.begin() as s:
            files = [(f.id, files_db.ORPHAN) for f in found if f.id not in known]
            await files_db.record(s, submission.batch_id, files)

    @activity.defn(name=BATCH_POLL)
    async def poll(self, batch_id: str) -> str:
        """Ask the provider about the batch. Still running: cancel it when no job waits for it
        any more, else return `submitted`. Ended: store each line's outcome and charge every
        answered one (activities/batch_results.py), signal the items' jobs, mark the batch
        ended, delete its files at the provider, return its ended status."""
        bid = uuid.UUID(batch_id)
        async with self.deps.sessionmaker() as s:
            batch = await batches_db.get(s, bid)
            live = await batches_db.live_items(s, bid)
        if batch is None:
            return "missing"
        if batch.status != "submitted" or batch.provider_batch_id is None:
            return batch.status
        try:
            client = self._batch_client(batch)
            remote = await client.get(batch.provider_batch_id)
            if not remote.ended and live == 0 and remote.status != "cancelling":
                remote = await client.cancel(remote.id)
                log.info("batch.cancelled_at_provider", extra={"batch_id": batch_id})
            if not remote.ended:
                return "submitted"
            counts = await Results(self.deps, batch).record(client, remote)
        except ExecutionFailure as exc:
            if datetime.now(UTC) - (batch.submitted_at or batch.created_at) > GIVE_UP_AFTER:
                await self._fail(bid, NO_ANSWER, end="expired")
                return "expired"
            raise _failure(exc) from None
        log.info(
            "batch.results",
            extra={"batch_id": batch_id, "recorded": counts.recorded, "charged": counts.charged},
        )
        await self._signal(bid)
        await self._end(bid, remote, batch.input_file_id)
        await self._delete_files(bid)
        return remote.status

    async def _signal(self, bid: uuid.UUID) -> None:
        """`batch-result` to each job whose item has its outcome; a job workflow that no longer
        exists is fine (its job ended some other way)."""
        async with self.deps.sessionmaker() as s:
            workflow_ids = await results_db.workflows_to_signal(s, bid)
        for workflow_id in workflow_ids:
            try:
                await self.client.get_workflow_handle(workflow_id).signal(BATCH_RESULT_SIGNAL)
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
                log.info("batch.job_gone", extra={"batch_id": str(bid)})

    async def _end(self, bid: uuid.UUID, remote: ProviderBatch, input_file_id: str | None) -> None:
        """The batch ended, its results stored: its files are recorded (each is now due for
        deletion at the provider)."""
        files = [
            (file_id, role)
            for file_id, role in (
                (input_file_id, files_db.INPUT),
                (remote.output_file_id, files_db.OUTPUT),
                (remote.error_file_id, files_db.ERROR),
            )
            if file_id
        ]
        async with self.deps.sessionmaker.begin() as s:
            await batches_db.end(
                s,
                bid,
                remote.status,
                output_file_id=remote.output_file_id,
                error_file_id=remote.error_file_id,
            )
            await files_db.record(s, bid, files)

    async def _delete_files(self, bid: uuid.UUID) -> None:
        """The batch's files due for deletion, deleted now; what fails is left to the
        reconciler's retention phase (never holds anything back)."""
        try:
            await delete_due(self.deps.sessionmaker, self.clients, batch_id=bid)
        except Exception as exc:
            log.warning(
                "batch.files_not_deleted", extra={"batch_id": str(bid), "error": type(exc).__name__}
            )

    async def _fail(self, bid: uuid.UUID, code: str, *, end: str = "failed") -> None:
        """The batch failed as a whole: its waiting items fail with `code` (each job retries in
        a later batch), their jobs are told, the batch ends, its files are deleted."""
        async with self.deps.sessionmaker.begin() as s:
            await results_db.fail_items(s, bid, code)
        await self._signal(bid)
        async with self.deps.sessionmaker.begin() as s:
            await batches_db.end(s, bid, end)
        await self._delete_files(bid)
