"""Token prices per model, and the cost of one provider call in USD.

Prices are USD per one million tokens, as `Decimal` so that sums are exact. Unknown models cost
0 (DEFAULT_PRICE): the engine must never fail a job because a price is missing; cost reporting
for such models simply reads 0 until the table is updated.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

_MILLION = Decimal(1_000_000)
_QUANTUM = Decimal("0.00000001")  # 8 decimal places


@dataclass(frozen=True)
class Price:
    usd_per_million_in: Decimal
    usd_per_million_out: Decimal


PRICES: dict[str, Price] = {
    "deepseek-chat": Price(Decimal("0.27"), Decimal("1.10")),
    "deepseek-reasoner": Price(Decimal("0.55"), Decimal("2.19")),
    "gpt-4o-mini": Price(Decimal("0.15"), Decimal("0.60")),
    "synthetic": Price(Decimal(0), Decimal(0)),
}

# Price of any model missing from PRICES: free (see the module docstring for why).
DEFAULT_PRICE = Price(Decimal(0), Decimal(0))


def price_for(model: str) -> Price:
    return PRICES.get(model, DEFAULT_PRICE)


def cost_usd(model: str, tokens_in: int, tokens_out: int) -> Decimal:
    """Cost of a call, quantized to 8 decimal places with ROUND_HALF_UP."""
    if tokens_in < 0 or tokens_out < 0:
        raise ValueError("token counts must be non-negative")
    price = price_for(model)
    raw = (
        Decimal(tokens_in) * price.usd_per_million_in
        + Decimal(tokens_out) * price.usd_per_million_out
    ) / _MILLION
    return raw.quantize(_QUANTUM, rounding=ROUND_HALF_UP)


class PriceTable:
    """The prices one process charges with. Built once at startup and passed down (through the
    gateway to EXECUTE); `cost_usd` is what a usage row records."""

    def __init__(self, prices: dict[str, Price] | None = None) -> None:
        self._prices = dict(PRICES if prices is None else prices)

    def price_for(self, model: str) -> Price:
        return self._prices.get(model, DEFAULT_PRICE)

    def cost_usd(self, model: str, tokens_in: int, tokens_out: int) -> Decimal:
        if tokens_in < 0 or tokens_out < 0:
            raise ValueError("token counts must be non-negative")
        price = self.price_for(model)
        raw = (
            Decimal(tokens_in) * price.usd_per_million_in
            + Decimal(tokens_out) * price.usd_per_million_out
        ) / _MILLION
        return raw.quantize(_QUANTUM, rounding=ROUND_HALF_UP)
