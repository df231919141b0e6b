"""A provider call's "call sent" mark: what it is charged if its worker dies during it.

EXECUTE writes the mark in a transaction the call already has (its attempt's first: take and
admission; a fallback move's own), before the call goes out (db/call_marks.py). It carries the
call's worst case, exactly what jobs/charging.py charges a call of which nothing was read: the
prompt as create estimated it with the quote's margin and the whole answer budget, at the price
of the model the call goes to, at its tier (an off-peak window's price inside one). For a
one-call job that is the quote's `worstCaseCostUsd`. The usage row of the call replaces the
mark when the call ends in any way its worker sees; one left behind is charged as it stands.
"""

from __future__ import annotations

from db.call_marks import CallMark
from db.chunks import ChunkRow
from db.jobs import JobRow
from engine.tokens import count_chat_tokens
from jobs import offpeak
from jobs.charging import Bound, charge
from jobs.spec import AnyJobType
from providers.base import CallProgress
from providers.pricing import PriceTable

# What a call that was sent and of which nothing was read has done, as far as charging knows.
_SENT_NOTHING_READ = CallProgress(request_sent=True)


def prompt_estimate(
    jt: AnyJobType, row: JobRow, chunk: ChunkRow | None, snapshot: dict[str, object] | None
) -> int:
    """The prompt tokens create estimated for this call (a chunk's, or the job's); a job created
    before estimates were stored: its prompt counted now."""
    estimated = chunk.input_tokens if chunk is not None else row.estimated_input_tokens
    if estimated is not None:
        return estimated
    if snapshot is None:
        return 0
    prompt = jt.prompt(jt.input_model.model_validate(snapshot["input"]))
    return count_chat_tokens(prompt.system, prompt.user)


def sent_mark(
    prices: PriceTable,
    *,
    row: JobRow,
    jt: AnyJobType,
    chunk: ChunkRow | None,
    call_no: int,
    attempt: int,
    provider: str,
    model: str,
    prompt_tokens: int,
    margin: float,
    tier: offpeak.CallTier,
) -> CallMark:
    """The mark of call `call_no` of `attempt` to `model`, charged its worst case at `tier`
    (jobs/offpeak.py `call_tier`: the tier the call starts at)."""
    budget = row.max_output_tokens or jt.definition.execution.max_output_tokens
    c = charge(
        prices,
        model,
        None,
        _SENT_NOTHING_READ,
        Bound(prompt_tokens, budget, margin),
        tier=tier.tier,
        discount=tier.discount,
    )
    assert c is not None  # a call sent is always charged
    return CallMark(
        job_id=row.id,
        call_no=call_no,
        attempt_no=attempt,
        chunk_no=chunk.chunk_no if chunk is not None else None,
        user_id=row.user_id,
        job_type=row.job_type,
        credential_mode=row.credential_mode,
        provider=provider,
        model=c.model,
        priced_as=c.priced_as,
        tokens_in=c.tokens_in,
        tokens_out=c.tokens_out,
        cost_usd=c.cost_usd,
        service_tier=c.service_tier,
    )
