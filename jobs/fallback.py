"""A job's fallback chain and the admission of a call on one of its entries.

Whose chain: a platform-key job of a type that does not opt out (`fallback: "none"`), whose
primary is a real provider, gets the AI_FALLBACKS entries its type's `fallback` keeps
(providers/fallback.py `select`). A job on a user's own key has no chain: its calls never move
to a key of the platform's (nor spend the platform's quota for a user's outage).

An entry's call is admitted as the primary's is (jobs/admission.py), under the entry's own
identity: its gate (`GateKey(provider, "fallback:<n>")`, its own pause and breaker), the cost
cover at the entry's price (jobs/costs.py `cover_next_call`: with what the job has spent so far,
the primary's failed call included, another worst case at this model's price must fit the
reservation, else it grows under the user's budgets or the call is refused), its key, and its
(provider, model, key) limits. `admit` wraps the primary's admission: when the primary's
breaker is open, the call goes straight to the first entry whose own gate is closed. A job whose
rollout arm names an entry's model (jobs/rollouts.py) is admitted on that entry first (the
primary when the entry says wait), and moves only to the entries after it.
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncSession

from db import jobs as jobs_db
from db import pauses as pauses_db
from db import provider_gate as provider_gate_db
from db import provider_limits as provider_limits_db
from db.jobs import JobRow
from db.provider_gate import GateKey
from db.provider_limits import LimitKey
from engine.capacity import job_class
from engine.definition import PLATFORM_KEY
from engine.flow import OPERATOR_PAUSE
from jobs import admission, pauses
from jobs.admission import AdmissionConfig, Call, Lease, Refused, Ticket
from jobs.gateway import Gateway
from jobs.spec import AnyJobType
from jobs.waits import Wait
from providers.fallback import FallbackEntry, position_of, select

log = logging.getLogger(__name__)


def applies(jt: AnyJobType, mode: str, *, primary_synthetic: bool) -> bool:
    """Whether a job of this type and credential mode may fall back at all (module docstring)."""
    return (
        mode == PLATFORM_KEY
        and not jt.always_synthetic
        and not primary_synthetic
        and jt.definition.fallback != "none"
    )


def chain(gateway: Gateway, jt: AnyJobType, mode: str) -> tuple[FallbackEntry, ...]:
    """The entries a job's calls may move to, in order (empty: no fallback)."""
    entries = gateway.fallbacks.entries
    primary_synthetic = gateway.provider_for(jt, mode).name == "synthetic"
    if not entries or not applies(jt, mode, primary_synthetic=primary_synthetic):
        return ()
    picked = select([e.model for e in entries], jt.definition.fallback)
    return tuple(entries[i] for i in picked)


def chain_models(
    primary: str, fallback_models: tuple[str, ...], jt: AnyJobType, mode: str, *, synthetic: bool
) -> tuple[str, ...]:
    """The models a job's calls may be priced at: the primary, then its chain's (what create
    reserves the worst of: jobs/costs.py `chain_price`)."""
    if not fallback_models or not applies(jt, mode, primary_synthetic=synthetic):
        return (primary,)
    picked = select(fallback_models, jt.definition.fallback)
    return (primary, *(fallback_models[i] for i in picked))


def arm_entry(gateway: Gateway, jt: AnyJobType, row: JobRow) -> FallbackEntry | None:
    """The AI_FALLBACKS entry a job's rollout arm tries first (None: its arm names no model,
    or the configured one, or the job has no chain)."""
    if row.arm_model is None or row.credential_mode != PLATFORM_KEY or jt.always_synthetic:
        return None
    if gateway.provider_for(jt, row.credential_mode).name == "synthetic":
        return None
    wanted = row.arm_model.lower()
    return next((e for e in gateway.fallbacks.entries if e.model.lower() == wanted), None)


def entry_of(gateway: Gateway, ticket: Ticket) -> FallbackEntry | None:
    """The chain entry a ticket was admitted on (None: the primary)."""
    position = position_of(ticket.gate.key_ref) if ticket.gate is not None else None
    return gateway.fallbacks.entry(position) if position is not None else None


async def admit(
    s: AsyncSession, gateway: Gateway, cfg: AdmissionConfig, call: Call
) -> Ticket | Wait | Refused:
    """The primary's admission; when its breaker is open (nothing was taken), the first entry
    of the chain whose own gate admits the call. An entry whose gate is closed took nothing and
    is passed over; an entry whose limits say wait answers that wait, and one whose cost cover
    refuses answers the primary's wait (the caller rolls back what either took). Every entry
    closed: the primary's wait."""
    arm = arm_entry(gateway, call.jt, call.row)
    if arm is not None:  # its rollout's arm tries this entry first
        routed = await admit_entry(s, gateway, cfg, call, arm)
        if isinstance(routed, Ticket | Refused):
            return routed
    got = await admission.admit(s, gateway, cfg, call)
    if not isinstance(got, Wait) or got.reason != "breaker":
        return got
    for entry in chain(gateway, call.jt, call.row.credential_mode):
        routed = await admit_entry(s, gateway, cfg, call, entry)
        if isinstance(routed, Wait) and routed.reason in ("pause", "breaker", OPERATOR_PAUSE):
            continue
        if isinstance(routed, Refused):
            return got
        if isinstance(routed, Ticket):
            log.warning(
                "primary provider's breaker is open; the call goes to a fallback",
                extra={
                    "job_id": str(call.row.id),
                    "from_model": got.model,
                    "to_model": entry.model,
                    "fallback_position": entry.position,
                    "reason": "breaker",
                },
            )
        return routed
    return got


async def admit_entry(
    s: AsyncSession, gateway: Gateway, cfg: AdmissionConfig, call: Call, entry: FallbackEntry
) -> Ticket | Wait | Refused:
    """A call on `entry`: an operator pause of its model, its gate, the cost cover at its
    price, its key, its limits, in the caller's transaction (a `Wait` or `Refused`: the caller
    rolls it back or moves on; a `Wait` from a pause or the gate took nothing)."""
    in_force = call.pauses if call.pauses is not None else await pauses_db.in_force(s)
    paused = pauses.held(
        in_force,
        job_type=call.row.job_type,
        provider=entry.provider,
        model=entry.model,
        user_id=call.row.user_id,
    )
    if paused is not None:
        return paused
    gate = GateKey(entry.provider, entry.key_ref)
    ticket = Ticket(gate=gate)
    probe_ttl_s = call.jt.definition.execution.timeout_ms / 1000 + 30
    gated = await provider_gate_db.admit(s, gate, probe_ttl_s=probe_ttl_s)
    if gated.wait_s > 0:
        return Wait(gated.wait_s, gated.reason or "pause", entry.provider, entry.model)
    ticket.probe_held = gated.probe
    refused = await _cover(s, gateway, cfg, call, entry)
    if refused is not None:
        if ticket.probe_held:
            await provider_gate_db.release_probe(s, gate)
        return Refused(refused)
    ticket.api_key = entry.api_key.get_secret_value()
    row, jt = call.row, call.jt
    limits = cfg.model_limits.for_model(entry.provider, entry.model)
    prompt = call.chunk.input_tokens if call.chunk is not None else row.estimated_input_tokens
    tokens = (prompt or 0) + (row.max_output_tokens or jt.definition.execution.max_output_tokens)
    got = await provider_limits_db.admit(
        s,
        LimitKey(entry.provider, entry.model, entry.key_ref),
        limits,
        tokens=tokens,
        job_id=row.id,
        lease_ttl_s=call.timeout_ms / 1000 + 30,
        job_class=job_class(row.queue_name),
    )
    if got.wait_s > 0:
        return Wait(got.wait_s, got.reason or "announced", entry.provider, entry.model)
    key = LimitKey(entry.provider, entry.model, entry.key_ref)
    ticket.lease = Lease(key, limits, tokens, got.lease_id, got.metered)
    return ticket


async def _cover(
    s: AsyncSession, gateway: Gateway, cfg: AdmissionConfig, call: Call, entry: FallbackEntry
) -> str | None:
    """The cost cover of a call on `entry` (as jobs/admission.py covers the primary's, at the
    entry's price), over the job as it stands now (the primary's failed call charged)."""
    row = call.row
    if row.estimated_input_tokens is None:
        return None
    fresh = await jobs_db.get(s, row.id)
    if fresh is not None:
        row = fresh
    return await admission.cover_at(s, cfg, call, row, gateway.prices.price_for(entry.model))
