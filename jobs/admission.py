"""Provider admission: whether a job's call may go now, and what it took if it may.

`admit` runs in EXECUTE's first transaction, after the job was taken: the job's (provider, key)
gate (a 429's pause, the circuit breaker and its one half-open probe, db/provider_gate.py), the
cost cover of a call after a paid one (jobs/costs.py `cover_next_call`), the job's key, then
the (provider, model, key) limits (db/provider_limits.py), last, so the key's limit row stays
locked only until that commit. It answers a `Ticket` (call now), a `Wait` (the caller rolls its
transaction back: nothing was taken, no attempt spent) or `Refused` (the cost limits allow no
further call).

A `Ticket` holds what must be settled by the call's end, on every exit path: the probe (its
outcome tells the gate whether the key answered) and the lease and tokens the limits granted
(given back, with what the answer's rate-limit headers announced). `Ticket.limit_settle` says
what the last transaction settles, `Ticket.note_failure` and `Ticket.settle` settle a failed
call in the caller's transaction, and `Ticket.release` frees whatever no outcome settled.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from db import chunks as chunks_db
from db import provider_gate as provider_gate_db
from db import provider_limits as provider_limits_db
from db.chunks import ChunkRow
from db.jobs import JobRow
from db.pauses import InForce
from db.provider_gate import PLATFORM_KEY_REF, GateKey
from db.provider_limits import LimitKey, Limits, LimitSettle, LimitTable
from db.session import SessionMaker
from engine.capacity import job_class
from engine.errors import ExecutionFailure, Fault
from engine.scopes import JobScopes
from jobs import offpeak, pauses, scope_budgets
from jobs.costs import budget_windows, call_worst_case_usd, cover_next_call, padded
from jobs.gateway import Gateway
from jobs.spec import AnyJobType
from jobs.waits import Wait
from providers.base import ProviderResponse
from providers.pricing import Price

log = logging.getLogger(__name__)


class AdmissionConfig(Protocol):
    """The settings admission reads (the worker's `EngineConfig`)."""

    @property
    def model_limits(self) -> LimitTable: ...
    @property
    def estimate_margin(self) -> float: ...
    @property
    def budget_per_day_usd(self) -> float: ...
    @property
    def budget_per_month_usd(self) -> float: ...
    @property
    def retry_after_max_s(self) -> float: ...
    @property
    def breaker_failures(self) -> int: ...
    @property
    def breaker_cooldown_s(self) -> float: ...


@dataclass(frozen=True)
class Refused:
    """Another call would take the job past its cost cap or its user past a budget (`limit`)."""

    limit: str


@dataclass
class Lease:
    """What the key's provider limits granted this call."""

    key: LimitKey
    limits: Limits
    tokens: int  # reserved: estimated input + the answer's budget
    lease_id: uuid.UUID | None = None  # held under a concurrency limit
    metered: bool = False  # the token bucket took `tokens`


@dataclass
class Ticket:
    """A call admitted: the gate it goes through, whether it holds the gate's probe, the
    limits' lease, and the job's key (or why there is none)."""

    gate: GateKey | None = None
    probe_held: bool = False
    lease: Lease | None = None
    api_key: str | None = field(default=None, repr=False)
    key_failure: ExecutionFailure | None = None

    def settled(self) -> None:
        """A committed outcome settled the probe and the lease."""
        self.probe_held = False
        self.lease = None

    def limit_settle(
        self, response: ProviderResponse | None, *, called: bool, max_block_s: float
    ) -> LimitSettle | None:
        """The call's end for its key's limits: the lease ends, the tokens it reserved and did
        not use go back, the answer's rate-limit headers are recorded (even for a key no limit
        is configured for: what the provider announces paces the next calls). A call without an
        answer is taken to have used what it reserved (the provider may have counted it).
        None: nothing was taken and nothing announced, no statement."""
        lease, headers = self.lease, response.rate_limit if response is not None else None
        if lease is None or not (
            lease.lease_id is not None or lease.metered or headers is not None
        ):
            return None
        if response is not None:
            used = response.tokens_in + response.tokens_out
        else:
            used = lease.tokens if called else 0
        return LimitSettle(
            lease.key,
            lease.lease_id,
            tokens_reserved=lease.tokens if lease.metered else 0,
            tokens_used=used,
            headers=headers,
            limits=lease.limits,
            max_block_s=max_block_s,
        )

    async def settle(
        self,
        s: AsyncSession,
        response: ProviderResponse | None,
        *,
        called: bool,
        max_block_s: float,
    ) -> None:
        """`limit_settle`'s statements in the caller's transaction."""
        st = self.limit_settle(response, called=called, max_block_s=max_block_s)
        if st is not None:
            await provider_limits_db.settle(
                s,
                st.key,
                st.lease_id,
                tokens_reserved=st.tokens_reserved,
                tokens_used=st.tokens_used,
                headers=st.headers,
                limits=st.limits,
                max_block_s=st.max_block_s,
            )

    async def note_failure(
        self, s: AsyncSession, job_id: uuid.UUID, failure: ExecutionFailure, cfg: AdmissionConfig
    ) -> None:
        """What a failed call tells every worker about the job's (provider, key): a 429 pauses
        that key's calls for the Retry-After; only health failures (5xx, transport errors,
        timeouts) count towards its breaker; any other answer shows the provider reachable.
        A request's own error (400, 413, 422...) and a key's (401/403, 402) touch no other
        job. A probe that learned nothing (no call, a cancel) is released."""
        gate = self.gate
        if gate is None:
            return
        where = {"job_id": str(job_id), "provider": gate.provider}
        where["key_kind"] = gate.key_ref.partition(":")[0]
        if failure.code == "PROVIDER_RATE_LIMITED":
            pause_s = min(failure.retry_after_float or 1.0, cfg.retry_after_max_s)
            await provider_gate_db.pause(s, gate, pause_s)
            log.warning(
                "provider rate limited this key; its calls pause on every worker",
                extra={**where, "pause_s": pause_s, "alert": "AIJOBS_PROVIDER_PAUSED"},
            )
        elif failure.fault is Fault.PROVIDER:
            cooldown_s = cfg.breaker_cooldown_s
            threshold = cfg.breaker_failures
            if await provider_gate_db.failed(s, gate, threshold=threshold, cooldown_s=cooldown_s):
                log.warning(
                    "provider keeps failing for this key; its circuit breaker is open",
                    extra={
                        **where,
                        "cooldown_s": cooldown_s,
                        "alert": "AIJOBS_PROVIDER_BREAKER_OPEN",
                    },
                )
        elif failure.answered:
            await provider_gate_db.reachable(s, gate)
        elif self.probe_held:
            await provider_gate_db.release_probe(s, gate)

    async def release(self, sm: SessionMaker) -> None:
        """Whatever no outcome settled (an error in the bookkeeping itself): the probe, so the
        next caller probes instead of waiting for its TTL, and the lease, so its slot is free
        at once. Each in a transaction of its own; a failure leaves it to its TTL."""
        if self.probe_held and self.gate is not None:
            try:
                async with sm.begin() as s:
                    await provider_gate_db.release_probe(s, self.gate)
                self.probe_held = False
            except Exception:  # the probe's TTL still bounds it
                log.warning("could not release a provider probe", exc_info=True)
        if self.lease is not None and self.lease.lease_id is not None:
            try:
                async with sm.begin() as s:
                    await provider_limits_db.release(s, self.lease.lease_id, self.lease.key)
                self.lease = None
            except Exception:  # the lease's TTL still bounds it
                log.warning("could not release a provider call lease", exc_info=True)


@dataclass(frozen=True)
class Call:
    """The call to admit: the job (as its first transaction read it), its type, the chunk it is
    for (None: the job's one call) and its timeout."""

    row: JobRow
    jt: AnyJobType
    chunk: ChunkRow | None
    timeout_ms: int
    # The operator pauses the transaction read (its take: db/attempts.py); None: not read yet
    # (a fallback entry's admission in a transaction of its own reads them).
    pauses: tuple[InForce, ...] | None = None


async def admit(
    s: AsyncSession, gateway: Gateway, cfg: AdmissionConfig, call: Call
) -> Ticket | Wait | Refused:
    """The gate, the cost cover, the key and the limits, in the caller's transaction, in that
    order. A `Wait` or `Refused` leaves things taken in the transaction: the caller rolls it
    back."""
    row, jt = call.row, call.jt
    if call.pauses:  # an operator pause of the primary's model (a rollout arm's was tried first)
        model = gateway.model_for(jt, row.credential_mode)
        provider = gateway.provider_for(jt, row.credential_mode).name
        paused = pauses.held(
            call.pauses, job_type=row.job_type, provider=provider, model=model, user_id=row.user_id
        )
        if paused is not None:
            return paused
    gate = gateway.gate_key(jt, row.credential_mode, row.user_id, row.credential_id)
    ticket = Ticket(gate=gate)
    if gate is not None:
        probe_ttl_s = jt.definition.execution.timeout_ms / 1000 + 30
        admission = await provider_gate_db.admit(s, gate, probe_ttl_s=probe_ttl_s)
        if admission.wait_s > 0:
            model = gateway.model_for(jt, row.credential_mode)
            return Wait(admission.wait_s, admission.reason or "pause", gate.provider, model)
        ticket.probe_held = admission.probe
    if row.estimated_input_tokens is not None:
        refused = await _cover(s, gateway, cfg, call)
        if refused is not None:
            return Refused(refused)
    try:
        ticket.api_key = await gateway.api_key(
            s, jt, row.user_id, row.credential_mode, row.credential_id
        )
    except ExecutionFailure as f:
        ticket.key_failure = f
        return ticket
    got = await _admit_limits(s, gateway, cfg, call, gate)
    if isinstance(got, Wait):
        return got
    ticket.lease = got
    return ticket


async def _cover(s: AsyncSession, gateway: Gateway, cfg: AdmissionConfig, call: Call) -> str | None:
    """Which cost limit this call would exceed (the job's cap, or its user's budget) beyond
    what create reserved (jobs/costs.py `cover_next_call`): only a call after a paid one can.
    Covered calls grow the job's reservation in this transaction. None: covered."""
    model = gateway.model_for(call.jt, call.row.credential_mode)
    tier = offpeak.call_tier(gateway, call.jt, call.row, dt.datetime.now(dt.UTC))  # its window's
    return await cover_at(s, cfg, call, call.row, gateway.prices.price_for(model).at_tier(*tier))


async def cover_at(
    s: AsyncSession, cfg: AdmissionConfig, call: Call, row: JobRow, price: Price
) -> str | None:
    """`_cover` for a call priced at `price`, over the job as `row` says it stands (a fallback
    entry's call is covered at that entry's price, after the primary's call was charged)."""
    budget = row.max_output_tokens or call.jt.definition.execution.max_output_tokens
    if call.chunk is not None:
        # A chunked job's reservation holds every chunk not yet succeeded (this one and
        # those in flight included), each padded as create padded it and priced once as
        # create priced the whole: with nothing spent, exactly what create reserved.
        unfinished = await chunks_db.unfinished_input_tokens(s, row.id)
        worst = call_worst_case_usd(
            sum(padded(t, cfg.estimate_margin) for t in unfinished),
            budget * len(unfinished),
            price=price,
            margin=0.0,
        )
    else:
        worst = call_worst_case_usd(
            row.estimated_input_tokens or 0, budget, price=price, margin=cfg.estimate_margin
        )
    scopes = JobScopes(row.org_id, tuple(row.team_ids), tuple(row.tags))

    async def scopes_hold(grow_usd: Decimal) -> str | None:
        return await scope_budgets.refusal_to_grow(s, scopes, row.id, grow_usd)

    return await cover_next_call(
        s,
        job_id=row.id,
        user_id=row.user_id,
        reserved_usd=row.reserved_cost_usd,
        spent_usd=row.spent_cost_usd,
        max_cost_usd=row.max_cost_usd,
        call_worst_usd=worst,
        windows=budget_windows(
            cfg.budget_per_day_usd, cfg.budget_per_month_usd, dt.datetime.now(dt.UTC)
        ),
        scopes_refusal=scopes_hold if scopes else None,
    )


async def _admit_limits(
    s: AsyncSession, gateway: Gateway, cfg: AdmissionConfig, call: Call, gate: GateKey | None
) -> Lease | Wait | None:
    """The provider limits of the call's (provider, model, key): its request and tokens are
    taken, or how long to wait. The synthetic provider is limited only when AI_MODEL_LIMITS
    names its model; otherwise it costs no statement."""
    row, jt = call.row, call.jt
    provider = gateway.provider_for(jt, row.credential_mode).name
    model = gateway.model_for(jt, row.credential_mode)
    limits = cfg.model_limits.for_model(provider, model)
    if gate is None and not limits.configured:
        return None  # the synthetic provider announces nothing
    key = LimitKey(provider, model, gate.key_ref if gate is not None else PLATFORM_KEY_REF)
    # What OpenAI counts against TPM: the prompt and the whole answer budget. Jobs created
    # before the estimate was stored: the type's budget and no input. A chunk: its prompt.
    prompt_tokens = (
        call.chunk.input_tokens if call.chunk is not None else row.estimated_input_tokens
    )
    tokens = (prompt_tokens or 0) + (
        row.max_output_tokens or jt.definition.execution.max_output_tokens
    )
    chunk_no = call.chunk.chunk_no if call.chunk is not None else None
    got = await provider_limits_db.admit(
        s,
        key,
        limits,
        tokens=tokens,
        job_id=row.id,
        # A dead worker's lease frees the slot once the call could no longer be running.
        lease_ttl_s=call.timeout_ms / 1000 + 30,
        chunk_no=chunk_no,
        user_id=row.user_id,
        job_class=job_class(row.queue_name),
    )
    if got.wait_s > 0:
        reason = got.reason or "announced"
        return Wait(
            got.wait_s,
            reason,
            provider,
            model,
            key,
            limits,
            tokens,
            row.user_id,
            chunk_no,
            job_class(row.queue_name),
        )
    return Lease(key, limits, tokens, got.lease_id, got.metered)
