"""What one provider call is charged, however it ended.

Every call the engine sent may be billed by the provider, so every one is charged
(`charge`):

- an answer read whole with its usage: that usage ("reported"), at the price of the model the
  provider echoed when the price table knows it, else of the requested model
  (`PriceTable.priced_as`): the reservation that let the job run was made at the requested
  model's price, so an unknown echo never moves the charge off it. Cached prompt tokens are
  charged the cache-hit price and reasoning tokens the output price (`PriceTable.call_cost`);
- any other ending (a cancel, a timeout, a drain, a broken connection, an answer without
  usage): `providers.base.charge_for` over the call's `CallProgress` (the usage seen if any; an
  error answer read to its end, what the provider said; else the prompt estimate and what was
  received with the margin, or the worst case), at the requested model's price. An estimated
  charge is rounded up, as the reservation was, so a call of which nothing was read costs
  exactly the quote's `worstCaseCostUsd` for that call;
- a call never sent: nothing (None).

The bound (`Bound`) is what create estimated for this call: the job's (or the chunk's) prompt
tokens, its answer budget, and the margin the quote's worst case uses (jobs/costs.py
ESTIMATE_MARGIN).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from providers.base import CallProgress, ProviderResponse, charge_for
from providers.pricing import PriceTable

Basis = Literal["reported", "estimated"]
_CHARS_PER_TOKEN = 4  # how a read answer's length becomes tokens when nothing else says


@dataclass(frozen=True)
class Bound:
    """What create reserved one call for: its prompt tokens (before the margin), its answer
    budget, and the margin."""

    prompt_tokens: int
    max_output_tokens: int
    margin: float


@dataclass(frozen=True)
class Charged:
    """One call's charge: the model as echoed (the requested one when nothing was echoed), the
    model whose price it paid, its tokens and their cached and reasoning parts, its cost, and
    whether the provider reported the usage or the engine bounded it."""

    model: str
    priced_as: str | None
    tokens_in: int
    tokens_out: int
    cached_input_tokens: int
    reasoning_tokens: int
    cost_usd: Decimal
    basis: Basis
    service_tier: str = "standard"  # the tier its price was at (jobs/offpeak.py)


def charge(
    prices: PriceTable,
    requested: str,
    response: ProviderResponse | None,
    progress: CallProgress | None,
    bound: Bound,
    *,
    tier: str = "standard",
    discount: Decimal | None = None,
) -> Charged | None:
    """The call's charge (rules in the module docstring) at `tier` (`discount`: an off-peak
    window's price factor); None when it was never sent."""
    if response is not None and response.usage_reported:
        priced = prices.priced_as(response.model, requested)
        cost = prices.call_cost(
            priced,
            response.tokens_in,
            response.tokens_out,
            response.cached_input_tokens,
            tier=tier,
            discount=discount,
        )
        return Charged(
            response.model,
            priced,
            response.tokens_in,
            response.tokens_out,
            response.cached_input_tokens,
            response.reasoning_tokens,
            cost,
            "reported",
            tier,
        )
    if response is not None and (progress is None or not progress.request_sent):
        # A provider that keeps no progress answered without usage: what was read is the answer.
        n = len(response.content)
        progress = CallProgress(True, 200, None, n, -(-n // _CHARS_PER_TOKEN), True)
    if progress is None:
        return None
    c = charge_for(progress, bound.prompt_tokens, bound.max_output_tokens, bound.margin)
    if c is None:
        return None
    echoed = response.model if response is not None else requested
    priced = (
        prices.priced_as(echoed, requested)
        if response is not None
        else prices.canonical(requested) or requested
    )
    if c.basis == "estimated":
        # Rounded up as create's worst case was: the reservation covers it to the last digit.
        cost = prices.worst_case_cost(
            priced, c.tokens_in, c.tokens_out, 0.0, tier=tier, discount=discount
        )
    else:
        cost = prices.call_cost(
            priced, c.tokens_in, c.tokens_out, c.cached_input_tokens, tier=tier, discount=discount
        )
    return Charged(
        echoed,
        priced,
        c.tokens_in,
        c.tokens_out,
        c.cached_input_tokens,
        c.reasoning_tokens,
        cost,
        c.basis,
        tier,
    )
