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
from decimal import Decimal
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError

from activities.deps import StageDeps
from db import batches as batches_db
from db import fallback_calls as calls_db
from db import usage as usage_db
from db.batches import BatchRow, Enrolled, Settled
from db.provider_gate import PLATFORM_KEY_REF
from db.usage import UsageRow
from engine.errors import ExecutionFailure, Retry, retry_rule
from engine.tiers import BATCH, BATCH_RESULT_SIGNAL
from providers.base import Usage
from providers.batch import (
    BatchClient,
    LineResult,
    ProviderBatch,
    batch_line,
    has_batch_api,
    jsonl,
    parse_results,
)
from providers.openai_compat import OpenAICompatibleProvider

log = logging.getLogger("activities.batch")

BATCH_WORKFLOW = "ai_batch"
BATCH_TIMING = "batch_timing"
BATCH_SUBMIT = "batch_submit"
BATCH_POLL = "batch_poll"
# A submitted batch the provider still cannot be asked about this long after its submission
# (its 24 h window and a margin) fails its items: each job retries in a later batch.
GIVE_UP_AFTER = timedelta(hours=25)
# What an item that got no answer fails with (the batch failed, expired or was cancelled).
NO_ANSWER = "PROVIDER_UNAVAILABLE"


@dataclass(frozen=True)
class BatchTiming:
    """AI_BATCH_WINDOW_S (how long a batch gathers jobs) and AI_BATCH_POLL_S (how often a
    submitted batch is polled), read by each batch workflow run from its worker."""

    window_s: float = 60.0
    poll_s: float = 60.0


async def start_batch_workflow(client: Client, enrolled: Enrolled, task_queue: str) -> None:
    """Start the batch's workflow (`ai-batch:{batch_id}`) on the jobs' task queue, unless it
    was started already (running or ended: a batch's workflow runs once). Call it after the
    enroll committed; it is idempotent, so a retried enroll calls it again."""
    try:
        await client.start_workflow(
            BATCH_WORKFLOW,
            args=[str(enrolled.batch_id), False],
            id=enrolled.workflow_id,
            task_queue=task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        )
    except WorkflowAlreadyStartedError:
        pass


@dataclass(frozen=True)
class BatchCharge:
    """What one answered line is charged: the model as echoed, the model priced as, its
    reported usage and its cost at the batch price."""

    model: str
    priced_as: str
    usage: Usage
    cost_usd: Decimal


def batch_charge(deps: StageDeps, requested: str, line: LineResult) -> BatchCharge | None:
    """The charge of an answered line; None when the provider reported no usage (nothing
    billed: an error answer)."""
    if line.usage is None:
        return None
    echoed = line.body.get("model") if line.body is not None else None
    model = echoed if isinstance(echoed, str) and echoed else requested
    prices = deps.gateway.prices
    priced = prices.priced_as(model, requested)
    u = line.usage
    cost = prices.call_cost(priced, u.tokens_in, u.tokens_out, u.cached_input_tokens, tier=BATCH)
    return BatchCharge(model, priced, u, cost)


def usage_row(
    batch: BatchRow,
    settled: Settled,
    charge: BatchCharge,
    error_code: str | None,
    call_no: int | None,
) -> UsageRow:
    """The usage row of one answered item: at the batch price, `service_tier` batch; its
    latency is the batch's, from submission to the results."""
    latency = datetime.now(UTC) - (batch.submitted_at or batch.created_at)
    u = charge.usage
    return UsageRow(
        job_id=settled.job_id,
        user_id=settled.user_id,
        job_type=settled.job_type,
        attempt_no=settled.attempt,
        credential_mode=settled.credential_mode,
        provider=batch.provider,
        model=charge.model,
        tokens_in=u.tokens_in,
        tokens_out=u.tokens_out,
        cost_usd=charge.cost_usd,
        latency_ms=min(int(latency.total_seconds() * 1000), 2**31 - 1),
        error_code=error_code,
        call_no=call_no,
        priced_as=charge.priced_as,
        cached_input_tokens=u.cached_input_tokens,
        reasoning_tokens=u.reasoning_tokens,
        service_tier=BATCH,
    )


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

    def all(self) -> list[Any]:
        return [self.timing, self.submit, self.poll]

    def _batch_client(self, batch: BatchRow) -> BatchClient:
        """The batch endpoints of the batch's provider with the platform key: the one route a
        batch has (a user's own key is DeepSeek's, which has no batch API)."""
        gw = self.deps.gateway
        provider = gw.provider
        usable = (
            isinstance(provider, OpenAICompatibleProvider)
            and provider.name == batch.provider
            and has_batch_api(provider)
            and batch.key_ref == PLATFORM_KEY_REF
        )
        if not usable or not isinstance(provider, OpenAICompatibleProvider):
            raise ExecutionFailure(
                "PROVIDER_UNAVAILABLE", internal_message="no batch route for this batch's provider"
            )
        return BatchClient(provider.base_url, provider.http_client, gw.platform_api_key)

    @activity.defn(name=BATCH_TIMING)
    async def timing(self) -> list[float]:
        return [self.timing_config.window_s, self.timing_config.poll_s]

    @activity.defn(name=BATCH_SUBMIT)
    async def submit(self, batch_id: str) -> str:
        """Close the batch's window, upload its pending items as one JSONL file and create the
        batch at the provider. Returns the batch's status: `submitted`, or `cancelled` (no item
        left to send, no call made), or `failed` (the provider refused it for good, or kept
        failing until the last attempt: its items fail with the provider's code)."""
        bid = uuid.UUID(batch_id)
        async with self.deps.sessionmaker.begin() as s:
            status, items = await batches_db.close(s, bid)
            batch = await batches_db.get(s, bid)
        if status != "submitting" or batch is None:
            return status
        if not items:
            async with self.deps.sessionmaker.begin() as s:
                await batches_db.end(s, bid, "cancelled")
            log.info("batch.empty", extra={"batch_id": batch_id})
            return "cancelled"
        try:
            client = self._batch_client(batch)
            file_id = await client.upload(jsonl(batch_line(i.custom_id, i.body) for i in items))
            created = await client.create(file_id, metadata={"ai_batch_id": batch_id})
        except ExecutionFailure as exc:
            if _retryable_now(exc):
                raise _failure(exc) from None
            await self._fail(bid, exc.code)
            log.info("batch.submit_failed", extra={"batch_id": batch_id, "code": exc.code})
            return "failed"
        async with self.deps.sessionmaker.begin() as s:
            await batches_db.mark_submitted(
                s, bid, provider_batch_id=created.id, input_file_id=file_id
            )
        log.info("batch.submitted", extra={"batch_id": batch_id, "items": len(items)})
        return "submitted"

    @activity.defn(name=BATCH_POLL)
    async def poll(self, batch_id: str) -> str:
        """Ask the provider about the batch. Still running: cancel it when no job waits for it
        any more, else return `submitted`. Ended: store each item's outcome and charge every
        answered one (one transaction), signal the items' jobs, mark the batch ended, return
        its ended status."""
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
            files = [f for f in (remote.output_file_id, remote.error_file_id) if f]
            results = parse_results(*[await client.content(f) for f in files])
        except ExecutionFailure as exc:
            if datetime.now(UTC) - (batch.submitted_at or batch.created_at) > GIVE_UP_AFTER:
                await self._fail(bid, NO_ANSWER, end="expired")
                return "expired"
            raise _failure(exc) from None
        await self._record(batch, results)
        await self._signal(bid)
        await self._end(bid, remote)
        return remote.status

    async def _record(self, batch: BatchRow, results: dict[str, LineResult]) -> None:
        """Each open item's outcome and, for an answered one, its usage row at the batch
        price, in one transaction: an item already recorded is not charged again."""
        recorded = charged = 0
        async with self.deps.sessionmaker.begin() as s:
            for item in await batches_db.open_items(s, batch.id):
                line = results.get(item.custom_id)
                ok = line is not None and line.succeeded
                settled = await batches_db.settle(
                    s,
                    item.id,
                    status="succeeded" if ok else "failed",
                    response=line.body if line is not None and ok else None,
                    error_code=None if ok else (line.error_code if line else None) or NO_ANSWER,
                )
                recorded += settled is not None
                charge = None if line is None else batch_charge(self.deps, batch.model, line)
                if settled is None or line is None or charge is None:
                    continue
                call_no = await calls_db.next_call(s, settled.job_id)
                row = usage_row(batch, settled, charge, line.error_code, call_no)
                await usage_db.insert(s, row)
                charged += 1
        log.info(
            "batch.results",
            extra={"batch_id": str(batch.id), "recorded": recorded, "charged": charged},
        )

    async def _signal(self, bid: uuid.UUID) -> None:
        """`batch-result` to each job whose item has its outcome; a job workflow that no longer
        exists is fine (its job ended some other way)."""
        async with self.deps.sessionmaker() as s:
            workflow_ids = await batches_db.workflows_to_signal(s, bid)
        if self.deps.signal_all is None:
            raise RuntimeError("the batch activities need the worker's signal sender")
        # Strict: a signal Temporal refused fails the activity, which retries; a job workflow
        # that no longer exists needs none (its job ended some other way).
        sent = await self.deps.signal_all(
            self.client, workflow_ids, BATCH_RESULT_SIGNAL, strict=True
        )
        if sent < len(workflow_ids):
            log.info("batch.job_gone", extra={"batch_id": str(bid)})

    async def _end(self, bid: uuid.UUID, remote: ProviderBatch) -> None:
        async with self.deps.sessionmaker.begin() as s:
            await batches_db.end(
                s,
                bid,
                remote.status,
                output_file_id=remote.output_file_id,
                error_file_id=remote.error_file_id,
            )

    async def _fail(self, bid: uuid.UUID, code: str, *, end: str = "failed") -> None:
        """The batch failed as a whole: its waiting items fail with `code` (each job retries in
        a later batch), their jobs are told, the batch ends."""
        async with self.deps.sessionmaker.begin() as s:
            await batches_db.fail_items(s, bid, code)
        await self._signal(bid)
        async with self.deps.sessionmaker.begin() as s:
            await batches_db.end(s, bid, end)
