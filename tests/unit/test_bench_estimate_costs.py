"""The money table of the estimates bench prices each scenario with the engine's own price table:
a cached prompt is charged less than a plain one, reasoning tokens more, and a reservation that
does not cover a charge is counted as such (the table must be able to say NO)."""

from __future__ import annotations

from decimal import Decimal

from bench.estimate_costs import (
    CACHE_UNIT,
    Priced,
    price_sample,
    render_costs,
    summarize_costs,
)
from bench.estimates import Sample
from providers.pricing import PriceTable


def _sample(reference: int = 2_000, calls: int = 1) -> Sample:
    return Sample(
        job_type="quiz_generation",
        language="en",
        size=2_000,
        seed=0,
        calls=calls,
        estimate=2_050,
        reference=reference,
        expected_output=1_500,
        reference_output=900,
    )


def test_cached_is_cheaper_and_reasoning_dearer_than_plain() -> None:
    table = PriceTable()
    plain = price_sample(_sample(), "plain", table, 0.25)
    cached = price_sample(_sample(), "cached", table, 0.25)
    reasoning = price_sample(_sample(), "reasoning", table, 0.25)
    assert cached.charged_usd < plain.charged_usd < reasoning.charged_usd
    # Every token but the last incomplete cache unit is a hit, at the cache-hit price.
    expected = table.call_cost("deepseek-chat", 2_000, 900, cached_in=2_000 - CACHE_UNIT)
    assert cached.charged_usd == expected
    # The quote does not know about reasoning: the same expected figure, a larger charge.
    assert reasoning.reserved_usd >= reasoning.charged_usd


def test_a_reservation_below_the_charge_is_reported_uncovered() -> None:
    rows = summarize_costs(
        [
            Priced("t", "plain", Decimal("1"), Decimal("2"), Decimal("1")),
            Priced("t", "plain", Decimal("1"), Decimal("1"), Decimal("3")),
        ]
    )
    (row,) = rows
    assert row.covered == 1 and row.samples == 2
    assert row.error_min < 0
    assert "1 / 2" in render_costs(rows)
