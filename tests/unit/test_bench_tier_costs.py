"""The arithmetic of `bench/tier_costs.py` on hand-made samples (no tokenizer, no inputs): the
cache units of DeepSeek and OpenAI, the cached share, each tier's price and the ratios the
report shows."""

from __future__ import annotations

from decimal import Decimal

import pytest

from bench.estimates import Sample
from bench.tier_costs import (
    Measured,
    common_prefix,
    cost_rows,
    deepseek_cached,
    job_cost,
    openai_cached,
    per_1000,
    render,
    stable_prefix,
    tier_cost,
)
from jobs.spec import Prompt
from providers.pricing import PriceTable


def _measured(calls: int, estimate: int, reference: int, out: int = 500) -> Measured:
    sample = Sample("quiz_generation", "en", 300, 0, calls, estimate, reference, out, out)
    return Measured(sample, prefix_tokens=200, prefix_reference=210, output_budget=4096)


def test_prefixes() -> None:
    assert common_prefix(["abcx", "abcy", "abz"]) == "ab"
    assert common_prefix([]) == "" and common_prefix(["same"]) == "same"
    shared = stable_prefix([Prompt("sys", "head: one"), Prompt("sys", "head: two")])
    assert shared == Prompt("sys", "head: ")
    # Systems that differ: the user messages come after a difference, nothing of them is shared.
    assert stable_prefix([Prompt("sys A", "u"), Prompt("sys B", "u")]) == Prompt("sys ", "")


def test_cache_units() -> None:
    assert [deepseek_cached(n) for n in (0, 63, 64, 200, 256)] == [0, 0, 64, 192, 256]
    assert [openai_cached(n) for n in (200, 1023, 1024, 1151, 1152, 1300)] == [
        0,
        0,
        1024,
        1024,
        1152,
        1280,
    ]


def test_the_cached_share_counts_whole_units_per_call() -> None:
    m = _measured(calls=2, estimate=1000, reference=1100)
    assert m.cached_share == pytest.approx(2 * 192 / 1000)
    assert m.deepseek_cached_in == 2 * 192  # DeepSeek's count of the prefix: 210 -> 192
    assert m.openai_cached_in == 0  # under OpenAI's 1,024-token minimum
    # A prompt no longer than its prefix is all cached, never more.
    assert _measured(calls=1, estimate=150, reference=150).cached_share == 1.0
    assert _measured(calls=1, estimate=150, reference=150).deepseek_cached_in == 150


def test_tier_prices() -> None:
    table = PriceTable()
    # deepseek-chat: 0.27 in, 0.07 cache hit, 1.10 out per million.
    standard = tier_cost(table, "deepseek-chat", 1_000_000, 100_000, 400_000, "standard")
    assert standard == Decimal("0.6") * Decimal("0.27") + Decimal("0.4") * Decimal(
        "0.07"
    ) + Decimal("0.1") * Decimal("1.10")
    offpeak = tier_cost(table, "deepseek-chat", 1_000_000, 100_000, 400_000, "offpeak")
    assert offpeak == standard / 2
    batch = tier_cost(table, "gpt-4o-mini", 1_000_000, 100_000, 0, "batch")
    assert batch == tier_cost(table, "gpt-4o-mini", 1_000_000, 100_000, 0, "standard") / 2
    assert tier_cost(table, "deepseek-chat", 1_000_000, 100_000, 0, "reused") == 0


def test_job_cost_uses_each_providers_count_and_cache() -> None:
    table = PriceTable()
    m = _measured(calls=2, estimate=1000, reference=1100)
    plain = job_cost(table, m, "deepseek-chat", "standard", cache=False)
    assert plain == table.call_cost("deepseek-chat", 1100, 500)
    cached = job_cost(table, m, "deepseek-chat", "standard", cache=True)
    assert cached == table.call_cost("deepseek-chat", 1100, 500, cached_in=384) < plain
    assert job_cost(table, m, "gpt-4o-mini", "standard", cache=False) == table.call_cost(
        "gpt-4o-mini", 1000, 500
    )
    # The answer is cut at the calls' answer budget, as the provider stops at max_tokens.
    big = Measured(Sample("q", "en", 1, 0, 1, 10, 10, 1, 9000), 0, 0, output_budget=4096)
    assert job_cost(table, big, "deepseek-chat", "standard", cache=False) == table.call_cost(
        "deepseek-chat", 10, 4096
    )


def test_rows_are_ratios_against_standard_without_the_cache() -> None:
    group = [_measured(1, 1000, 1100), _measured(3, 5000, 5200, out=900)]
    assert per_1000([Decimal("0.001"), Decimal("0.003")]) == Decimal(2)
    rows = {r.model: r for r in cost_rows(group, PriceTable())}
    ds, oa = rows["deepseek-chat"], rows["gpt-4o-mini"]
    base = per_1000(
        [job_cost(PriceTable(), m, "deepseek-chat", "standard", cache=False) for m in group]
    )
    assert ds.standard_per_1000_usd == pytest.approx(float(base))
    assert ds.ratios["standard"] == 1.0
    assert ds.ratios["batch"] is None and oa.ratios["offpeak"] is None  # not offered
    assert ds.ratios["offpeak"] == pytest.approx(0.5, abs=1e-6)
    cached = ds.ratios["standard+cache"]
    assert cached is not None and 0 < cached < 1
    assert ds.ratios["offpeak+cache"] == pytest.approx(cached / 2, abs=1e-6)
    assert oa.ratios["batch"] == pytest.approx(0.5, abs=1e-6)
    assert oa.ratios["standard+cache"] == 1.0  # prefixes under OpenAI's minimum: no hit
    assert ds.ratios["reused"] == oa.ratios["reused"] == 0.0
    text = render([], list(rows.values()))
    assert "| quiz_generation | deepseek-chat |" in text and "n/a" in text and "0.500 x" in text
