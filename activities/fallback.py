"""EXECUTE's provider fallback: a platform-key call whose provider fails with a health failure
(a 5xx, a transport error, a timeout; providers/fallback.py `falls_back`) moves, in the same
attempt, to the next entry of the job's chain (jobs/fallback.py `chain`).

The move, in order: the failed call is charged and recorded as any failed call is (its usage
row names its model, priced at its price; the failure counts on its own gate's breaker and
settles its limits), in its own transaction; then a transaction admits the entry
(jobs/fallback.py `admit_entry`: its gate, the cost cover at its price, its key, its limits)
and numbers the new call (its usage row's identity); then the same prompt goes to the entry's
model with the entry's key, under what is left of the job's timeout (a primary that used it
all leaves the job's retry, and the primary's breaker, to route around it). A request's, a
key's or a rate-limit failure never moves; nor does a call of a job without a chain.

What is visible: a log line and `aijobs_provider_fallbacks_total{from_model,to_model,reason}`
per move, and the move (which entry, why) in EXECUTE's result in the workflow's history
(`ExecuteResult.fallback`: models from configuration and a reason from a fixed set; never a
key or a URL). A call the gate sent straight to an entry (the primary's breaker open) is
recorded the same way, with reason "breaker".
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

from temporalio import activity

from activities.deps import StageDeps
from activities.heartbeat import beat_interval_s, heartbeating
from activities.telemetry import observe_call
from db import call_marks as call_marks_db
from db import fallback_calls as fallback_calls_db
from db.call_marks import CallMark
from db.jobs import JobRow
from engine.contracts import ExecuteInput, ExecuteResult
from engine.errors import ExecutionFailure
from jobs import attempt_start, call_marks, calls, structured_output
from jobs import fallback as chain_of
from jobs.admission import Call, Ticket
from jobs.offpeak import CallTier
from jobs.stream_items import Progress
from providers.base import CallProgress, Provider, ProviderRequest, ProviderResponse
from providers.fallback import FallbackEntry, falls_back, reason_of
from providers.structured import FormRefused, next_form

log = logging.getLogger(__name__)
# Less than this left of the job's timeout: no fallback call is started in this attempt.
MIN_FALLBACK_S = 1.0


class AttemptLike(Protocol):
    """What the move needs of EXECUTE's attempt (activities/execute.py `_Attempt`)."""

    _d: StageDeps
    inp: ExecuteInput
    ticket: Ticket
    number: int
    call_no: int | None
    started: attempt_start.Started | None
    route: Route

    async def _provider_call(
        self, provider: Provider, request: ProviderRequest, progress: Progress | None = None
    ) -> ProviderResponse: ...

    async def record_failure(
        self, row: JobRow, failure: ExecutionFailure, called: calls.Called, *, asked: bool = True
    ) -> None: ...


@dataclass
class Route:
    """Where an attempt's call went: the provider and request of its last call, and the move
    recorded for the history (`from_model -> to_model`, `reason`)."""

    provider: Provider | None = None
    request: ProviderRequest | None = None
    from_model: str = ""
    to_model: str = ""
    reason: str = ""

    def start(self, d: StageDeps, a: calls.Attempt, ticket: Ticket) -> tuple[Provider, str]:
        """The provider and model the admitted call goes to: the primary, or the entry the
        gate sent it to (its breaker open: recorded as a move with reason "breaker")."""
        row = a.row
        provider = d.gateway.provider_for(a.jt, row.credential_mode)
        model = d.gateway.model_for(a.jt, row.credential_mode)
        entry = chain_of.entry_of(d.gateway, ticket)
        if entry is None:
            return provider, model
        if entry.model != row.arm_model:  # not its arm's own model: the breaker sent it
            self.note(d, model, entry, "breaker")
        return d.gateway.fallbacks.providers[entry.position], entry.model

    def note(self, d: StageDeps, from_model: str, entry: FallbackEntry, reason: str) -> None:
        if not self.from_model:
            self.from_model = from_model
        self.to_model, self.reason = entry.model, reason
        d.metrics.fallbacks.moved(from_model, entry.model, reason)

    def final(
        self, provider: Provider, request: ProviderRequest | None, model: str
    ) -> tuple[Provider, ProviderRequest | None, str]:
        """The provider, request and model of the attempt's last call (after a move, the
        entry's), for its charge, its metrics and its usage row."""
        if self.provider is None or self.request is None:
            return provider, request, model
        return self.provider, self.request, self.request.model


def noted(attempt: AttemptLike, result: ExecuteResult) -> ExecuteResult:
    """EXECUTE's result with the attempt's move (if any) for the workflow's history."""
    r = attempt.route
    if not r.to_model:
        return result
    return dataclasses.replace(result, fallback=f"{r.from_model}->{r.to_model}:{r.reason}")


async def call(
    attempt: AttemptLike,
    a: calls.Attempt,
    provider: Provider,
    request: ProviderRequest,
    progress: Progress | None = None,
) -> ProviderResponse:
    """The call, and on a health failure the next entries of the chain in turn (module
    docstring). The last failure is raised as it came; `attempt.route` says where the last
    call went."""
    d = attempt._d
    deadline = time.monotonic() + attempt.inp.timeout_ms / 1000
    entries = list(chain_of.chain(d.gateway, a.jt, a.row.credential_mode))
    current = chain_of.entry_of(d.gateway, attempt.ticket)
    if current is not None:  # already on an entry: only those after it remain
        entries = [e for e in entries if e.position > current.position]
    moved = False
    while True:
        started = time.monotonic()
        try:
            if not moved:  # the primary's call, exactly as EXECUTE makes it
                return await attempt._provider_call(provider, request, progress)
            return await _send(attempt, provider, request, deadline - started)
        except FormRefused as refused:
            # Asked again at once in the next form down, same attempt, same endpoint.
            lowered = await _lowered(attempt, a, provider, request, refused, started)
            if lowered is None:
                raise
            request = lowered
            attempt.route.provider, attempt.route.request = provider, request
        except ExecutionFailure as failure:
            left = deadline - time.monotonic()
            if not entries or not falls_back(failure) or left < MIN_FALLBACK_S:
                raise
            if attempt.call_no is None:  # no identity: a second write would charge twice
                raise
            failed = await _record(attempt, a, provider, request, failure, started)
            # Recorded and settled: the raise below (no entry admits the call) records it
            # again under the same identity, which writes nothing and tells no gate twice.
            attempt.ticket = Ticket()
            to = await _move(attempt, a, entries, request, failure)
            if to is None:
                raise  # EXECUTE counts the call in its metrics, as any failed call
            _observe(attempt._d, provider, failed)
            entry, provider, request = to
            attempt.route.provider, attempt.route.request = provider, request
            moved = True
            entries = [e for e in entries if e.position > entry.position]


async def _send(
    attempt: AttemptLike,
    provider: Provider,
    request: ProviderRequest,
    timeout_s: float,
) -> ProviderResponse:
    """A moved call under `timeout_s` (what is left of the job's), heartbeating and checking
    the job's lock as EXECUTE's own call does, and once before it is sent (time has passed
    since the attempt took the job)."""
    d, started = attempt._d, attempt.started
    assert started is not None and started.fence is not None
    fence = started.fence
    ttl_s, extend_every_s = d.lock_policy(request.job_type)

    async def still_ours() -> bool:
        return await attempt_start.holds(d.sessionmaker, fence, ttl_s=ttl_s)

    return await calls.call(
        provider,
        request,
        timeout_s=timeout_s,
        beat=activity.heartbeat,
        beat_interval_s=beat_interval_s(),
        still_ours=still_ours,
        check_every_s=extend_every_s,
        check_first=True,
    )


async def _record(
    attempt: AttemptLike,
    a: calls.Attempt,
    provider: Provider,
    request: ProviderRequest,
    failure: ExecutionFailure,
    started: float,
) -> calls.Called:
    """The failed call before the move: charged at its own model's price, its usage row and
    what it tells its gate and limits (EXECUTE's `record_failure`)."""
    d = attempt._d
    latency_ms = int((time.monotonic() - started) * 1000)
    charged = calls.charged(d.gateway.prices, a, request, None, d.config.estimate_margin)
    cost = charged.cost_usd if charged is not None else Decimal(0)
    failed = calls.Called(
        provider.name, request.model, latency_ms, cost, None, failure, charged=charged
    )
    await attempt.record_failure(a.row, failure, failed)
    return failed


def _observe(d: StageDeps, provider: Provider, failed: calls.Called) -> None:
    """A moved call's metrics (a call that did not move is counted by EXECUTE itself)."""
    d.metrics.money.charged(provider.name, failed.model, failed.charged)
    code = failed.failure.code if failed.failure is not None else None
    latency_s = failed.latency_ms / 1000
    observe_call(
        d.metrics,
        provider.name,
        failed.model,
        latency_s,
        error_code=code,
        response=None,
        cost_usd=failed.cost,
    )


async def _lowered(
    attempt: AttemptLike,
    a: calls.Attempt,
    provider: Provider,
    request: ProviderRequest,
    refused: FormRefused,
    started: float,
) -> ProviderRequest | None:
    """The refused call charged (its usage row), the downgrade recorded for every process and
    the next call numbered, in one transaction (jobs/structured_output.py `refused`); the
    request in the next form down. None: there is none, or the call has no identity to charge
    it under (the refusal stands as REQUEST_REJECTED)."""
    lower = next_form(request.structured_output)
    if lower is None or attempt.call_no is None:
        return None
    d = attempt._d
    latency_ms = int((time.monotonic() - started) * 1000)
    charged = calls.charged(d.gateway.prices, a, request, None, d.config.estimate_margin)
    cost = charged.cost_usd if charged is not None else Decimal(0)
    failed = calls.Called(
        provider.name,
        request.model,
        latency_ms,
        cost,
        None,
        refused,
        charged=charged,
        form=request.structured_output,
    )
    usage = failed.usage(
        a.row,
        attempt.number,
        a.chunk.chunk_no if a.chunk else None,
        refused.code,
        call_no=attempt.call_no,
    )
    async with heartbeating(), d.sessionmaker.begin() as s:
        form, call_no = await structured_output.refused(
            s, usage, provider, request.model, lower, ttl_s=d.gateway.downgrade_ttl_s
        )
    if call_no is None:
        return None
    attempt.call_no = call_no
    _observe(d, provider, failed)
    structured_output.warn(a.row.id, request.model, request.structured_output, form)
    return calls.with_form(request, a, form)


class _NotAdmitted(Exception):
    """The entry does not admit the call now: its transaction rolls back."""


async def _move(
    attempt: AttemptLike,
    a: calls.Attempt,
    entries: list[FallbackEntry],
    failed: ProviderRequest,
    failure: ExecutionFailure,
) -> tuple[FallbackEntry, Provider, ProviderRequest] | None:
    """The first entry that admits the call (its own transaction: gate, cost cover, key,
    limits, a new call number), the attempt's ticket and call number moved to it; None: none
    admits it now (the failure stands; the job's retry decides)."""
    d, row = attempt._d, a.row
    call = Call(row, a.jt, a.chunk, attempt.inp.timeout_ms)
    for entry in entries:
        try:
            async with heartbeating(), d.sessionmaker.begin() as s:
                got = await chain_of.admit_entry(s, d.gateway, d.config, call, entry)
                if not isinstance(got, Ticket):
                    raise _NotAdmitted()
                call_no = await fallback_calls_db.next_call(s, row.id)
                if call_no is not None and got.key_failure is None:
                    # The moved call's mark commits before it is sent (db/call_marks.py).
                    await call_marks_db.mark_sent(s, _mark(d, a, entry, call_no))
        except _NotAdmitted:
            continue
        attempt.ticket, attempt.call_no = got, call_no
        reason = reason_of(failure)
        attempt.route.note(d, failed.model, entry, reason)
        log.warning(
            "provider failed with a health failure; the call moves to a fallback",
            extra={
                "job_id": str(row.id),
                "from_model": failed.model,
                "to_model": entry.model,
                "fallback_position": entry.position,
                "reason": reason,
                "error_code": failure.code,
            },
        )
        key, got.api_key = got.api_key, None
        provider = d.gateway.fallbacks.providers[entry.position]
        form = structured_output.form_for(
            d.gateway.forms, a.downgrades, provider, entry.model, entry=True
        )
        request = dataclasses.replace(  # a fallback provider's call is a standard one
            calls.with_form(failed, a, form),
            model=entry.model,
            api_key=key,
            progress=CallProgress(),
            service_tier="standard",
        )
        return entry, provider, request
    return None


def _mark(d: StageDeps, a: calls.Attempt, entry: FallbackEntry, call_no: int) -> CallMark:
    """A moved call's mark: the entry's model, at the standard price, its worst case."""
    return call_marks.sent_mark(
        d.gateway.prices,
        row=a.row,
        jt=a.jt,
        chunk=a.chunk,
        call_no=call_no,
        attempt=a.number,
        provider=d.gateway.fallbacks.providers[entry.position].name,
        model=entry.model,
        prompt_tokens=call_marks.prompt_estimate(a.jt, a.row, a.chunk, a.snapshot),
        margin=d.config.estimate_margin,
        tier=CallTier(),
    )
