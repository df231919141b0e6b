"""The provider call of one attempt and its bookkeeping: its request (the prompt built from the
input its guardrails mask, with the correction after an invalid answer, checked for content
safety when the job type asks), the call itself under the job's timeout while the caller's
heartbeats and lock extensions run beside it, its usage row, and a failed call's record.

Plain functions over their inputs: EXECUTE (activities/execute.py) passes its heartbeat and its
lock extension in, so this module knows nothing of Temporal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession

from db import chunks as chunks_db
from db import held_answers as held_answers_db
from db import lifecycle as lifecycle_db
from db import usage as usage_db
from db.chunks import ChunkRow
from db.jobs import JobRow
from db.session import SessionMaker
from db.usage import UsageRow
from engine.errors import ExecutionFailure
from engine.tokens import count_chat_tokens
from jobs import offpeak
from jobs.admission import AdmissionConfig, Ticket
from jobs.charging import Bound, Charged, charge
from jobs.chunked import chunk_model
from jobs.gateway import Gateway
from jobs.guardrails import holds, stored_input
from jobs.output import output_schema, strict_output_schema
from jobs.spec import AnyJobType
from providers.base import (
    CallProgress,
    Provider,
    ProviderRequest,
    ProviderResponse,
    SyntheticBehaviour,
)
from providers.pricing import PriceTable

# A 429 is the provider asking the key to wait, not a failed attempt: the job waits out the pause
# in its workflow and calls again under the same attempt number, this many times per attempt
# (a key that answers 429 forever must still end its jobs).
FREE_RATE_LIMITS_PER_ATTEMPT = 5


class SelfCancelled(Exception):
    """The call was aborted because SQL says the job was cancelled or is no longer ours."""


@dataclass(frozen=True)
class Attempt:
    """Whose call: the job (as read), its snapshot, its type, the attempt number, the chunk
    (None: the job's one call) and the job's timeout."""

    row: JobRow
    snapshot: dict[str, Any]
    jt: AnyJobType
    number: int
    chunk: ChunkRow | None
    timeout_ms: int
    # The structured-output forms lowered now (read with the take; jobs/structured_output.py).
    downgrades: Mapping[tuple[str, str], str] = field(default_factory=dict)


def request(
    gateway: Gateway,
    a: Attempt,
    model: str,
    api_key: str | None,
    on_delta: Callable[[str], None] | None = None,
    *,
    form: str = "json_object",
    inp: BaseModel | None = None,
) -> ProviderRequest:
    """The provider request: the prompt (with the correction after an invalid answer),
    checked for content safety when the job type asks; the job's key goes into it. It asks
    for a streamed answer (a model in AI_STREAM_DISABLED_MODELS is not asked), whose pieces go
    to `on_delta` as they arrive (jobs/stream_items.py), in structured-output `form` (with the
    strict schema of the job's output model for `json_schema`). `inp`: the input the prompt is
    built from, already masked (jobs/guardrails.py); None: the snapshot's, masked here."""
    jt, row = a.jt, a.row
    if inp is None:  # the input the prompt is built from: masked when the type masks PII
        inp = stored_input(jt, a.snapshot["input"], gateway.guardrails.pii_region)[0]
    model_in = inp
    if a.chunk is not None:
        model_in = chunk_model(jt, model_in, a.chunk.planned())  # its text, its share
    correction = None
    if a.number > 1 and row.correction_hint:
        correction = (
            f"Your previous answer was rejected: {row.correction_hint}. "
            "Answer again with JSON that matches the schema exactly."
        )
    prompt = jt.prompt(model_in, correction)
    if jt.definition.security.content_safety_check:
        gateway.safety.check([prompt.system, prompt.user])
    tier = offpeak.call_tier(gateway, jt, row, datetime.now(UTC))  # the call starts now
    output_model: type[BaseModel] = jt.output_model
    return ProviderRequest(
        job_id=str(row.id),
        job_type=row.job_type,
        attempt=a.number,
        model=model,
        system_prompt=prompt.system,
        user_prompt=prompt.user,
        output_schema=output_schema(output_model),
        timeout_s=a.timeout_ms / 1000,
        # The budget fixed at create (cut to fit a per-job cost cap); older jobs: the type's.
        max_tokens=row.max_output_tokens or jt.definition.execution.max_output_tokens,
        api_key=api_key,
        synthetic=(
            jt.synthetic_behaviour(model_in)
            if jt.synthetic_behaviour is not None
            else SyntheticBehaviour(output=jt.synthetic_output(model_in))
        ),
        # What the call has done so far: a call cut before its answer was read is still charged.
        progress=CallProgress(),
        stream=True,
        on_delta=on_delta,
        service_tier=tier.tier,
        discount=tier.discount,
        structured_output=form,
        schema_name=row.output_schema_version,
        strict_schema=strict_output_schema(output_model) if form == "json_schema" else None,
    )


def with_form(req: ProviderRequest, a: Attempt, form: str) -> ProviderRequest:
    """`req` asking in structured-output `form` instead (a lower form after a refusal, or a
    fallback entry's own), as a fresh call (its own progress)."""
    output_model: type[BaseModel] = a.jt.output_model
    return dataclasses.replace(
        req,
        structured_output=form,
        strict_schema=strict_output_schema(output_model) if form == "json_schema" else None,
        progress=CallProgress(),
    )


def charged(
    prices: PriceTable,
    a: Attempt,
    req: ProviderRequest | None,
    response: ProviderResponse | None,
    margin: float,
) -> Charged | None:
    """What the call of `req` is charged, however it ended (jobs/charging.py): None when no
    request was made (a prompt refused before the call)."""
    if req is None:
        return None
    return charge(
        prices,
        req.model,
        response,
        req.progress,
        bound(a, req, margin),
        tier=req.service_tier,
        discount=req.discount,
    )


def bound(a: Attempt, req: ProviderRequest, margin: float) -> Bound:
    """What create reserved this call for (jobs/charging.py): the chunk's or the job's
    estimated prompt (jobs created before estimates were stored: the prompt as counted now),
    its answer budget and the quote's margin."""
    estimated = a.chunk.input_tokens if a.chunk is not None else a.row.estimated_input_tokens
    if estimated is None:
        estimated = count_chat_tokens(req.system_prompt, req.user_prompt)
    return Bound(estimated, req.max_tokens or 0, margin)


async def call(
    provider: Provider,
    req: ProviderRequest,
    *,
    timeout_s: float,
    beat: Callable[[], None],
    beat_interval_s: float,
    still_ours: Callable[[], Awaitable[bool]],
    check_every_s: float,
    check_first: bool = False,
) -> ProviderResponse:
    """The provider call under `timeout_s`. `beat` runs every `beat_interval_s` on its own
    clock (a call that ends first costs none, and a slow database can never starve it); a
    separate task asks `still_ours` every `check_every_s` (extending the job's lock) and aborts
    the call with `SelfCancelled` when it answers False. A lost check is survivable (the lock's
    TTL has slack). `check_first`: ask `still_ours` once before the request is sent (an attempt
    that may have been taken over by now); False: `SelfCancelled`, nothing sent. That check is
    bounded like the others: a database that does not answer in time is no answer, and the
    checks during the call go on."""
    if check_first and not await _ours_or_unknown(still_ours, check_every_s):
        raise SelfCancelled()
    pending = asyncio.ensure_future(provider.generate(req))
    self_cancelled = False

    async def beats() -> None:
        while not pending.done():
            await asyncio.sleep(beat_interval_s)
            beat()

    async def checks() -> None:
        nonlocal self_cancelled
        while not pending.done():
            await asyncio.sleep(check_every_s)
            try:
                ours = await asyncio.wait_for(still_ours(), timeout=check_every_s)
            except Exception:
                continue
            if not ours:
                self_cancelled = True
                pending.cancel()
                return

    helpers = [asyncio.ensure_future(beats()), asyncio.ensure_future(checks())]
    try:
        async with asyncio.timeout(timeout_s):
            return await pending
    except asyncio.CancelledError:
        if self_cancelled and not _current_task_cancelling():
            raise SelfCancelled() from None
        raise
    finally:
        for h in helpers:
            h.cancel()
        if not pending.done():
            pending.cancel()


async def _ours_or_unknown(still_ours: Callable[[], Awaitable[bool]], within_s: float) -> bool:
    try:
        return await asyncio.wait_for(still_ours(), timeout=within_s)
    except Exception:
        return True


def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return bool(task and task.cancelling())


@dataclass
class Called:
    """What a provider call came to: an output that validated, or the failure to record."""

    provider: str
    model: str
    latency_ms: int = 0
    cost: Decimal = Decimal(0)  # priced once: the metric and the usage row agree
    response: ProviderResponse | None = None
    failure: ExecutionFailure | None = None
    out: dict[str, Any] | None = None  # the output as stored
    model_out: BaseModel | None = None  # the same, as the projector takes it
    charged: Charged | None = None  # what the call is charged (None: it was never sent)
    form: str | None = None  # the structured-output form it asked for (None: no call)
    flagged: int | None = None  # output items moderation dropped (None: it did not run)

    def usage(
        self,
        row: JobRow,
        attempt: int,
        chunk_no: int | None,
        error_code: str | None,
        *,
        call_no: int | None = None,
    ) -> UsageRow:
        """The call's ai_usage_log row; `call_no` (its take's number) makes it the one row of
        this call, however often it is written."""
        r, c = self.response, self.charged
        return UsageRow(
            job_id=row.id,
            user_id=row.user_id,
            job_type=row.job_type,
            attempt_no=attempt,
            credential_mode=row.credential_mode,
            provider=r.provider if r else (self.provider or "unknown"),
            model=c.model if c else r.model if r else (self.model or "unknown"),
            tokens_in=c.tokens_in if c else r.tokens_in if r else 0,
            tokens_out=c.tokens_out if c else r.tokens_out if r else 0,
            cost_usd=c.cost_usd if c else self.cost if r else Decimal(0),
            latency_ms=self.latency_ms,
            error_code=error_code,
            chunk_no=chunk_no,
            call_no=call_no,
            cost_basis=c.basis if c else "reported",
            priced_as=c.priced_as if c else None,
            cached_input_tokens=c.cached_input_tokens if c else 0,
            reasoning_tokens=c.reasoning_tokens if c else 0,
            service_tier=c.service_tier if c else "standard",
            structured_output=self.form,
        )


async def record_failure(
    s: AsyncSession,
    ticket: Ticket,
    cfg: AdmissionConfig,
    usage: UsageRow,
    failure: ExecutionFailure,
    *,
    response: ProviderResponse | None,
    called: bool,
) -> None:
    """A failed attempt in the caller's transaction: its usage row, what the failure tells the
    job's gate (`Ticket.note_failure`), the attempt's bookkeeping (the failure and its
    correction hint), the chunk's failure, and the call's end for its limits (`called`: the
    provider was asked, else the reserved tokens go back). A paid answer whose moderation
    could not run is kept for the next attempt (jobs/guardrails.py), and its call was a
    success: its usage row says so."""
    held = response.content if response is not None and holds(failure) else None
    if held is not None:
        usage = dataclasses.replace(usage, error_code=None)
        # The provider answered (its gate hears it reachable); only moderation could not run.
        failure = ExecutionFailure(
            failure.code, internal_message=failure.internal_message, answered=True
        )
    await usage_db.insert(s, usage)
    if held is not None:
        await held_answers_db.hold(s, usage.job_id, usage.chunk_no, held)
    await ticket.note_failure(s, usage.job_id, failure, cfg)
    await lifecycle_db.record_attempt(
        s,
        usage.job_id,
        attempt=usage.attempt_no,
        internal_error=failure.internal_message or failure.code,
        correction_hint=failure.correction_hint,
    )
    if usage.chunk_no is not None:
        await chunks_db.record_failure(
            s, usage.job_id, usage.chunk_no, usage.attempt_no, failure.code
        )
    await ticket.settle(s, response, called=called, max_block_s=cfg.retry_after_max_s)


async def rate_limit_is_free(
    sm: SessionMaker, job_id: uuid.UUID, attempt: int, chunk_no: int | None
) -> bool:
    """Whether this attempt's latest 429 may still be waited out without spending it (at most
    FREE_RATE_LIMITS_PER_ATTEMPT per attempt)."""
    async with sm() as s:
        seen = await usage_db.calls_with(
            s, job_id, attempt, "PROVIDER_RATE_LIMITED", chunk_no=chunk_no
        )
    return seen <= FREE_RATE_LIMITS_PER_ATTEMPT
