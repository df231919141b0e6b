"""EXECUTE's provider call (activities/execute.py `_Attempt.call`): what the call is prepared
with (its guardrails, its item publisher, its request in its model's structured-output form),
and the call under its attempt's heartbeat and lock checks (`provider_call`, the attempt's
`_provider_call`): `jobs/calls.py` `call` with the attempt's own clock. The SQL lock is extended
every `extend_every_s`, and the call aborted when SQL says the job was cancelled or is no longer
this attempt's; a call that may have been taken over checks once before it is sent."""

from __future__ import annotations

import time
from typing import Protocol

from temporalio import activity

from activities.deps import StageDeps
from activities.heartbeat import beat_interval_s
from engine.contracts import ExecuteInput
from jobs import attempt_start, calls, guardrails, stream_items, structured_output
from jobs import fallback as fallback_chain
from jobs.admission import Ticket
from jobs.guardrails import Guard
from jobs.stream_items import ItemPublisher, NoItems, Progress
from providers.base import Provider, ProviderRequest, ProviderResponse


class AttemptLike(Protocol):
    _d: StageDeps
    inp: ExecuteInput
    started: attempt_start.Started | None
    began: float
    ticket: Ticket
    number: int


async def prepared(
    attempt: AttemptLike, a: calls.Attempt, provider: Provider, model: str
) -> tuple[Guard, ItemPublisher | NoItems, ProviderRequest]:
    """The call's guardrails (its job's input masked when the type masks PII, off the event
    loop for a long one), its item publisher under them, and its request in the form `model`
    takes at `provider` (an AI_FALLBACKS entry's own form when the ticket is one's)."""
    d = attempt._d
    on_entry = fallback_chain.entry_of(d.gateway, attempt.ticket) is not None
    form = structured_output.form_for(
        d.gateway.forms, a.downgrades, provider, model, entry=on_entry
    )
    inp, masking = await guardrails.stored_input_off_loop(
        a.jt, a.snapshot["input"], d.gateway.guardrails.pii_region
    )
    guard = guardrails.Guard.of(d.gateway.guardrails, a.jt, masking)
    items = stream_items.publisher(d.sessionmaker, a.jt, a.row.id, attempt.number, a.chunk, guard)
    key = attempt.ticket.api_key
    request = calls.request(d.gateway, a, model, key, items.on_delta, form=form, inp=inp)
    return guard, items, request


def estimate_checked(
    d: StageDeps, a: calls.Attempt, model: str, response: ProviderResponse | None
) -> None:
    """The estimate against the answer's prompt tokens (a metric). A retry with a correction
    sends more than was estimated: only first prompts count."""
    row = a.row
    estimated = a.chunk.input_tokens if a.chunk is not None else row.estimated_input_tokens
    if response is not None and estimated and not row.correction_hint:
        d.metrics.estimate_checked(row.job_type, model, estimated, response.tokens_in)


async def provider_call(
    attempt: AttemptLike,
    provider: Provider,
    request: ProviderRequest,
    progress: Progress | None = None,
) -> ProviderResponse:
    d, started = attempt._d, attempt.started
    assert started is not None and started.fence is not None  # a call follows a take
    fence = started.fence
    ttl_s, extend_every_s = d.lock_policy(request.job_type)

    async def still_ours() -> bool:
        return await attempt_start.holds(d.sessionmaker, fence, ttl_s=ttl_s)

    return await calls.call(
        provider,
        request,
        timeout_s=attempt.inp.timeout_ms / 1000,
        beat=(lambda: activity.heartbeat(progress())) if progress else activity.heartbeat,
        beat_interval_s=beat_interval_s(),
        still_ours=still_ours,
        check_every_s=extend_every_s,
        check_first=attempt_start.may_be_taken_over(
            activity.info().heartbeat_timeout, time.monotonic() - attempt.began
        ),
    )
