"""Service-tier prices: a batch call pays the model's batch price (half the standard one unless
the table says otherwise; cached input at half the cache-hit price), an off-peak call the
standard price times its window's factor, and the create's estimate reserves at its tier's
price, so a job is never reserved at one tier's price and charged at another's."""

from __future__ import annotations

from decimal import Decimal

import pytest

from jobs.costs import JobEstimate, call_worst_case_usd, chain_price, estimate_job
from providers.pricing import PRICES, Price, PriceTable, parse_prices

MILLION = 1_000_000
HALF = Decimal("0.5")


def test_the_built_in_openai_models_state_half_price_batch_prices() -> None:
    for model in ("gpt-4o-mini", "gpt-4o"):
        p = PRICES[model]
        assert p.usd_per_million_batch_in == p.usd_per_million_in * HALF
        assert p.usd_per_million_batch_out == p.usd_per_million_out * HALF
    # DeepSeek has no Batch API: no batch price of its own (the default rule applies).
    assert PRICES["deepseek-chat"].usd_per_million_batch_in is None


@pytest.mark.parametrize("model", ["gpt-4o-mini", "gpt-4o", "deepseek-chat", "synthetic"])
def test_a_batch_call_costs_half_a_standard_one(model: str) -> None:
    t = PriceTable(warn=False)
    standard = t.call_cost(model, MILLION, MILLION)
    assert t.call_cost(model, MILLION, MILLION, tier="batch") == standard * HALF
    assert t.call_cost(model, MILLION, MILLION, tier="standard") == standard


def test_cached_input_under_batch_costs_half_the_cache_hit_price() -> None:
    t = PriceTable(warn=False)
    # gpt-4o: cache hit 1.25 per million, so 0.625 under batch; the rest at the batch input.
    assert t.call_cost("gpt-4o", MILLION, 0, cached_in=MILLION, tier="batch") == Decimal("0.625")
    assert t.call_cost("gpt-4o", 2 * MILLION, 0, cached_in=MILLION, tier="batch") == Decimal(
        "1.875"
    )
    # Without a cache-hit price: half the input price.
    plain = PriceTable({"m": Price(Decimal(2), Decimal(4))})
    assert plain.call_cost("m", MILLION, 0, cached_in=MILLION, tier="batch") == Decimal(1)


def test_an_explicit_batch_price_wins_over_half() -> None:
    t = PriceTable({"m": Price(Decimal(2), Decimal(4), None, None, Decimal("0.3"), Decimal("3"))})
    assert t.call_cost("m", MILLION, MILLION, tier="batch") == Decimal("3.3")
    assert t.call_cost("m", MILLION, MILLION) == Decimal(6)


def test_an_offpeak_call_costs_the_standard_price_times_its_discount() -> None:
    t = PriceTable(warn=False)
    standard = t.call_cost("deepseek-chat", MILLION, MILLION, cached_in=MILLION // 2)
    offpeak = t.call_cost(
        "deepseek-chat", MILLION, MILLION, cached_in=MILLION // 2, tier="offpeak", discount=HALF
    )
    assert offpeak == standard * HALF
    quarter = t.call_cost("deepseek-chat", MILLION, 0, tier="offpeak", discount=Decimal("0.25"))
    assert quarter == Decimal("0.0675")
    # No window price known: the standard price, never less than a standard reservation.
    assert t.call_cost("deepseek-chat", MILLION, MILLION, tier="offpeak") == t.call_cost(
        "deepseek-chat", MILLION, MILLION
    )
    # Only off-peak reads the discount.
    assert t.call_cost("gpt-4o", MILLION, 0, tier="batch", discount=Decimal("0.1")) == Decimal(
        "1.25"
    )


def test_an_unknown_model_under_a_tier_is_the_fallback_at_that_tier() -> None:
    seen: list[str] = []
    t = PriceTable({"m": Price(Decimal(2), Decimal(4))}, on_unpriced=seen.append, warn=False)
    assert t.call_cost("x", MILLION, MILLION, tier="batch") == Decimal(3)
    assert seen == ["x"]


@pytest.mark.parametrize(
    ("tier", "discount"), [("express", None), ("offpeak", Decimal(-1)), ("offpeak", Decimal("NaN"))]
)
def test_an_unknown_tier_or_a_bad_discount_is_refused(tier: str, discount: Decimal | None) -> None:
    with pytest.raises(ValueError):
        PriceTable(warn=False).call_cost("gpt-4o", 1, 1, tier=tier, discount=discount)


def test_worst_case_cost_at_a_tier_matches_the_create_path() -> None:
    t = PriceTable(warn=False)
    for tier, discount in (("standard", None), ("batch", None), ("offpeak", Decimal("0.5"))):
        for model in ("deepseek-chat", "gpt-4o-mini"):
            got = t.worst_case_cost(model, 1234, 4096, 0.25, tier=tier, discount=discount)
            assert got == call_worst_case_usd(
                1234, 4096, price=t.price_for(model), margin=0.25, tier=tier, discount=discount
            )
    assert t.worst_case_cost("gpt-4o", 1000, 1000, 0.0, tier="batch") == t.call_cost(
        "gpt-4o", 1000, 1000, tier="batch"
    )


def estimate(
    model: str,
    *,
    margin: float = 0.25,
    cap: Decimal | None = None,
    tier: str = "standard",
    discount: Decimal | None = None,
) -> JobEstimate:
    return estimate_job(
        [2000],
        model=model,
        price=PRICES[model],
        output_budget=4000,
        expected_output_tokens=1000,
        margin=margin,
        max_cost_usd=cap,
        tier=tier,
        discount=discount,
    )


def test_the_estimate_reserves_at_its_tiers_price() -> None:
    standard = estimate("gpt-4o-mini")
    batch = estimate("gpt-4o-mini", tier="batch")
    assert batch.worst_case_cost_usd == standard.worst_case_cost_usd * HALF
    assert batch.estimated_cost_usd == standard.estimated_cost_usd * HALF
    assert batch.call_worst_case_usd == standard.call_worst_case_usd * HALF
    offpeak = estimate("gpt-4o-mini", tier="offpeak", discount=HALF)
    assert offpeak.worst_case_cost_usd == batch.worst_case_cost_usd


def test_a_cap_buys_a_longer_answer_on_the_batch_tier() -> None:
    cap = Decimal("0.03")
    standard = estimate("gpt-4o", margin=0.0, cap=cap)
    batch = estimate("gpt-4o", margin=0.0, cap=cap, tier="batch")
    assert batch.output_budget > standard.output_budget
    assert batch.worst_case_cost_usd <= cap


def test_the_chain_price_tiers_only_the_primary() -> None:
    t = PriceTable(warn=False)
    # Off-peak primary at half, its standard-priced fallback still bounds the reservation.
    got = chain_price(t, ("deepseek-chat", "gpt-4o-mini"), tier="offpeak", discount=HALF)
    assert got.usd_per_million_in == Decimal("0.15")  # gpt-4o-mini's, above 0.135
    assert got.usd_per_million_out == Decimal("0.60")
    alone = chain_price(t, ("gpt-4o-mini",), tier="batch")
    assert alone.usd_per_million_in == Decimal("0.075")
    assert alone.cached_in == Decimal("0.0375")


def test_batch_prices_from_settings() -> None:
    prices = parse_prices(
        '{"m": {"input": 1, "output": 2, "batch": {"input": 0.4, "output": 0.9}},'
        ' "n": {"input": 1, "output": 2, "batch": null}}'
    )
    assert prices["m"].usd_per_million_batch_in == Decimal("0.4")
    assert prices["m"].usd_per_million_batch_out == Decimal("0.9")
    assert prices["n"].at_tier("batch").usd_per_million_in == Decimal("0.5")
    for bad, message in (
        ('{"m": {"input": 1, "output": 2, "batch": {"input": 1}}}', "batch: want an object"),
        ('{"m": {"input": 1, "output": 2, "batch": 0.5}}', "batch: want an object"),
        (
            '{"m": {"input": 1, "output": 2, "batch": {"input": -1, "output": 1}}}',
            "batch.input: want a non-negative",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            parse_prices(bad)


def test_a_usage_row_records_its_tier_standard_by_default() -> None:
    import uuid

    from db.models.usage import AiUsageLog
    from db.usage import INSERT, JOB_CALLS_SQL, UsageRow

    row = UsageRow(uuid.uuid4(), "u", "t", 1, "platform_key", "p", "m", 1, 1, Decimal(0), 1, None)
    assert row.service_tier == "standard"
    # Every field of the row is a parameter of the insert, the tier included.
    assert ":service_tier" in str(INSERT)
    assert set(row.__dict__) <= set(INSERT.compile().params)
    assert "service_tier" in JOB_CALLS_SQL
    column = AiUsageLog.__table__.c.service_tier
    assert not column.nullable
    assert column.server_default is not None
