"""Prices: a cost is never silently zero. Dated ids map to their model, an unknown model is
charged the fallback price (counted and warned about once), prices come from settings, and a
production worker refuses an AI_MODEL it cannot price."""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from activities.metrics import UNPRICED_MODEL_LABELS, WorkerMetrics
from engine.settings import ConfigurationError, Settings
from providers.pricing import PRICES, Price, PriceTable, parse_fallback, parse_prices
from runtime import cli
from runtime.wiring import gateway, price_problems
from tests.unit.settings_helpers import GOOD_SECRET, prod

MILLION = 1_000_000


def unpriced(registry: CollectorRegistry, model: str) -> float:
    value = registry.get_sample_value("aijobs_unpriced_calls_total", {"model": model})
    return value or 0.0


# ---- canonical names ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-4o-mini", "gpt-4o-mini"),
        ("GPT-4o-Mini", "gpt-4o-mini"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4o-20240806", "gpt-4o"),
        ("deepseek-chat-0324", "deepseek-chat"),
        ("deepseek-reasoner", "deepseek-reasoner"),
        # Longest known prefix at a boundary: never the shorter gpt-4o.
        ("gpt-4o-mini-search-preview", "gpt-4o-mini"),
        ("gpt-4o-audio-preview", "gpt-4o"),
        ("deepseek-chat:beta", "deepseek-chat"),
        # Not at a boundary, or not known at all.
        ("gpt-4omega", None),
        ("gpt-4", None),
        ("llama3-70b", None),
        ("", None),
    ],
)
def test_canonical(model: str, expected: str | None) -> None:
    assert PriceTable().canonical(model) == expected


def test_context_windows() -> None:
    t = PriceTable()
    assert t.context_window("deepseek-chat") == 65_536
    assert t.context_window("deepseek-reasoner") == 65_536
    assert t.context_window("gpt-4o-mini-2024-07-18") == 128_000
    assert t.context_window("gpt-4o") == 128_000
    assert t.context_window("synthetic") is None  # unbounded
    assert t.context_window("llama3-70b") is None  # unknown


# ---- cost -----------------------------------------------------------------------------------


def test_a_dated_id_is_priced_as_its_model() -> None:
    registry = CollectorRegistry()
    t = PriceTable(on_unpriced=WorkerMetrics(registry).unpriced_call)
    dated = t.cost_usd("gpt-4o-mini-2024-07-18", 2_000, 3_000)
    assert dated == t.cost_usd("gpt-4o-mini", 2_000, 3_000) == Decimal("0.0021")
    assert dated > 0
    assert unpriced(registry, "gpt-4o-mini-2024-07-18") == 0


def test_an_unknown_model_costs_the_fallback_counted_and_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    t = PriceTable(on_unpriced=WorkerMetrics(registry).unpriced_call)
    # Default fallback: the most expensive input and output prices of the table (gpt-4o).
    assert t.fallback == Price(Decimal("2.50"), Decimal("10.00"))
    with caplog.at_level(logging.WARNING, logger="providers.pricing"):
        first = t.cost_usd("mystery-model", MILLION, MILLION)
        second = t.cost_usd("mystery-model", MILLION, 0)
        t.cost_usd("deepseek-chat", 10, 10)  # known: neither counted nor warned
    assert first == Decimal("12.50") and second == Decimal("2.50")
    assert unpriced(registry, "mystery-model") == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "mystery-model" in warnings[0].getMessage()
    assert "AI_MODEL_PRICES" in warnings[0].getMessage()


def test_the_unpriced_label_is_bounded() -> None:
    registry = CollectorRegistry()
    t = PriceTable(on_unpriced=WorkerMetrics(registry).unpriced_call, warn=False)
    for i in range(UNPRICED_MODEL_LABELS + 5):
        assert t.cost_usd(f"random-{i}", 1, 1) > 0
    assert unpriced(registry, "random-0") == 1
    assert unpriced(registry, f"random-{UNPRICED_MODEL_LABELS - 1}") == 1
    assert unpriced(registry, f"random-{UNPRICED_MODEL_LABELS}") == 0
    assert unpriced(registry, "other") == 5


def test_only_synthetic_is_free_by_default() -> None:
    t = PriceTable()
    assert t.cost_usd("synthetic", 5_000, 5_000) == Decimal(0)
    for model in PRICES:
        if model != "synthetic":
            assert t.cost_usd(model, 1_000, 1_000) > 0, model


# ---- settings -------------------------------------------------------------------------------


def test_prices_and_the_fallback_come_from_settings() -> None:
    s = Settings.model_validate(
        {
            "AIJOBS_ENV": "test",
            "AI_MODEL_PRICES": '{"Llama3": {"input": 0.1, "output": "0.2", "context_window": 8192},'
            ' "gpt-4o-mini": {"input": 1, "output": 2}}',
            "AI_MODEL_FALLBACK_PRICE": '{"input": 3, "output": 4}',
        }
    )
    t = PriceTable.from_settings(s)
    assert t.cost_usd("llama3-8b-0001", MILLION, MILLION) == Decimal("0.3")
    assert t.context_window("llama3") == 8192
    # An entry replaces the built-in one of the same name (its window too: none given).
    assert t.cost_usd("gpt-4o-mini-2024-07-18", MILLION, 0) == Decimal(1)
    assert t.context_window("gpt-4o-mini") is None
    assert t.cost_usd("deepseek-chat", MILLION, 0) == Decimal("0.27")  # built-in kept
    assert t.cost_usd("unknown", MILLION, MILLION) == Decimal(7)


@pytest.mark.parametrize(
    ("prices", "message"),
    [
        ("{", "AI_MODEL_PRICES: not valid JSON"),
        ("[]", "AI_MODEL_PRICES: want a JSON object"),
        ('{"m": {"input": 1}}', "AI_MODEL_PRICES['m']: want an object with input, output"),
        ('{"m": {"input": -1, "output": 1}}', "AI_MODEL_PRICES['m'].input: want a non-negative"),
        ('{"m": {"input": true, "output": 1}}', "AI_MODEL_PRICES['m'].input: want a number"),
        ('{"m": {"input": "NaN", "output": 1}}', "AI_MODEL_PRICES['m'].input"),
        (
            '{"m": {"input": 1, "output": 1, "context_window": 0}}',
            "AI_MODEL_PRICES['m'].context_window",
        ),
        ('{"": {"input": 1, "output": 1}}', "AI_MODEL_PRICES: a model name"),
    ],
)
def test_malformed_prices_name_the_setting(prices: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_prices(prices)
    assert str(info.value).startswith(message)


def test_malformed_fallback_names_the_setting() -> None:
    assert parse_fallback("") is None
    with pytest.raises(ValueError, match=r"^AI_MODEL_FALLBACK_PRICE"):
        parse_fallback('{"input": 1, "output": 1, "context_window": 5}')
    with pytest.raises(ValueError, match=r"^AI_MODEL_FALLBACK_PRICE: not valid JSON"):
        parse_fallback("2.5/10")


def test_the_worker_gateway_charges_with_the_configured_table() -> None:
    registry = CollectorRegistry()
    s = Settings.model_validate(
        {"AIJOBS_ENV": "test", "AI_MODEL_PRICES": '{"house-model": {"input": 4, "output": 8}}'}
    )
    g = gateway(s, metrics=WorkerMetrics(registry))
    assert g.prices.cost_usd("house-model-2025-01-01", MILLION, MILLION) == Decimal(12)
    assert g.prices.cost_usd("not-known", 1, 1) > 0
    assert unpriced(registry, "not-known") == 1


# ---- production refuses a worker it cannot price ----------------------------------------------

PROVIDER = {"DEEPSEEK_API_KEY": "sk-live-x", "JWT_SECRET": GOOD_SECRET}


@pytest.mark.parametrize(
    ("queues", "env", "refused"),
    [
        (("ai-interactive",), {"AI_MODEL": "llama3-70b"}, True),
        ((), {"AI_MODEL": "llama3-70b"}, True),  # no --queue: every queue
        (("ai-system",), {"AI_MODEL": "llama3-70b"}, False),  # no provider calls
        (("ai-background",), {"AI_MODEL": "gpt-4o-mini-2024-07-18"}, False),
        (
            ("ai-interactive",),
            {"AI_MODEL": "llama3-70b", "AI_MODEL_PRICES": '{"llama3": {"input": 0, "output": 0}}'},
            False,
        ),
        (("ai-interactive",), {}, False),  # the default AI_MODEL, deepseek-chat
    ],
)
def test_production_refuses_a_worker_whose_model_has_no_price(
    queues: tuple[str, ...], env: dict[str, Any], refused: bool
) -> None:
    s = prod(**PROVIDER, **env)
    problems = price_problems(s, "worker", queues)
    assert bool(problems) == refused, problems
    if not refused:
        s.check_startup("worker", queues=queues, also=problems)
        return
    assert problems == [
        "AI_MODEL 'llama3-70b' has no price (add it to AI_MODEL_PRICES, with a price of 0 if "
        "it is free)"
    ]
    with pytest.raises(ConfigurationError, match="refusing to start in production: AI_MODEL"):
        s.check_startup("worker", queues=queues, also=problems)
    # Other roles and other environments do not care.
    assert price_problems(s, "api") == []
    dev = Settings.model_validate({"AIJOBS_ENV": "development", "AI_MODEL": "llama3-70b"})
    assert price_problems(dev, "worker") == []


def test_cli_worker_refuses_an_unpriced_model(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    environ.setenv("DEEPSEEK_API_KEY", "sk-live-x")
    environ.setenv("AI_MODEL", "llama3-70b")
    with pytest.raises(SystemExit) as info:
        cli._settings("worker", queues=["ai-interactive"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("aijobs worker: refusing to start in production: AI_MODEL 'llama3-70b'")
    assert "\n" not in err


@pytest.mark.parametrize("environment", ["development", "production"])
def test_cli_refuses_malformed_prices_in_every_environment(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], environment: str
) -> None:
    environ.setenv("AIJOBS_ENV", environment)
    environ.setenv("JWT_SECRET", GOOD_SECRET)
    environ.setenv("AI_MODEL_PRICES", '{"m": {"input": "cheap", "output": 1}}')
    with pytest.raises(SystemExit) as info:
        cli._settings("api")
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "aijobs api: invalid configuration: AI_MODEL_PRICES['m'].input: want a number"
    )


# --- cached and reasoning tokens, the price a call is charged as, the worst case ----------


def test_built_in_cache_hit_prices() -> None:
    hits = {m: PRICES[m].usd_per_million_cached_in for m in PRICES}
    assert hits == {
        "deepseek-chat": Decimal("0.07"),
        "deepseek-reasoner": Decimal("0.14"),
        "gpt-4o-mini": Decimal("0.075"),
        "gpt-4o": Decimal("1.25"),
        "synthetic": None,
    }


def test_cached_tokens_cost_the_cache_hit_price_and_no_token_twice() -> None:
    table = PriceTable(warn=False)
    # 1M prompt tokens of which 400k cached, 100k answer tokens (reasoning among them).
    cost = table.call_cost("deepseek-chat", 1_000_000, 100_000, cached_in=400_000)
    assert cost == Decimal("0.6") * Decimal("0.27") + Decimal("0.4") * Decimal("0.07") + (
        Decimal("0.1") * Decimal("1.10")
    )
    assert table.call_cost("deepseek-chat", 1000, 10) == table.cost_usd("deepseek-chat", 1000, 10)
    # A cached count above the prompt is cut to it: never below the all-cached cost.
    assert table.call_cost("gpt-4o", 100, 0, cached_in=500) == table.call_cost(
        "gpt-4o", 100, 0, cached_in=100
    )
    with pytest.raises(ValueError):
        table.call_cost("gpt-4o", 1, 1, cached_in=-1)


def test_without_a_cache_hit_price_cached_tokens_cost_the_input_price() -> None:
    table = PriceTable({"local": Price(Decimal("1"), Decimal("2"), 1000)})
    assert table.call_cost("local", 1000, 0, cached_in=1000) == table.cost_usd("local", 1000, 0)


def test_cache_hit_price_from_settings() -> None:
    prices = parse_prices(
        '{"m": {"input": 1, "output": 2, "cached_input": 0.25, "context_window": 10},'
        ' "n": {"input": 1, "output": 2}}'
    )
    assert prices["m"].usd_per_million_cached_in == Decimal("0.25")
    assert prices["n"].usd_per_million_cached_in is None
    assert prices["n"].cached_in == Decimal(1)
    with pytest.raises(ValueError, match=r"cached_input: want a non-negative"):
        parse_prices('{"m": {"input": 1, "output": 2, "cached_input": -1}}')
    with pytest.raises(ValueError, match=r"want an object with input, output"):
        parse_prices('{"m": {"input": 1, "output": 2, "cache": 1}}')


def test_an_unknown_echo_is_priced_as_the_requested_model_and_counted() -> None:
    unknown: list[str] = []
    unpriced: list[str] = []
    table = PriceTable(on_unknown_echo=unknown.append, on_unpriced=unpriced.append, warn=False)
    assert table.priced_as("gpt-4o-mini-2024-07-18", "gpt-4o-mini") == "gpt-4o-mini"
    assert table.priced_as("GPT-4o", "gpt-4o-mini") == "gpt-4o"
    assert unknown == []
    assert table.priced_as("m", "deepseek-chat") == "deepseek-chat"
    assert table.priced_as("deepseek/deepseek-chat", "deepseek-chat") == "deepseek-chat"
    assert unknown == ["m", "deepseek/deepseek-chat"]
    # The requested model's price, never the fallback.
    model = table.priced_as("m", "deepseek-chat")
    assert table.call_cost(model, 1000, 1000) == table.cost_usd("deepseek-chat", 1000, 1000)
    assert unpriced == []
    # Nothing known either way: the requested id, charged the fallback and reported.
    assert table.priced_as("x", "y") == "y"
    table.call_cost("y", 1, 1)
    assert unpriced == ["y"]


def test_priced_as_from_settings_counts_unknown_echoes() -> None:
    seen: list[str] = []
    table = PriceTable.from_settings(Settings(), on_unknown_echo=seen.append)
    assert table.priced_as("", "gpt-4o") == "gpt-4o"
    assert seen == []  # no echo at all is not an unknown echo
    table.priced_as("local-model", "gpt-4o")
    assert seen == ["local-model"]


def test_worst_case_cost_follows_the_create_path_rule() -> None:
    from jobs.costs import call_worst_case_usd

    table = PriceTable(warn=False)
    for model in ("deepseek-chat", "gpt-4o", "gpt-4o-mini"):
        for prompt, budget, margin in ((1234, 4096, 0.2), (1, 1, 0.0), (99_999, 8192, 0.35)):
            assert table.worst_case_cost(model, prompt, budget, margin) == call_worst_case_usd(
                prompt, budget, price=table.price_for(model), margin=margin
            )
    # The worst case has no cache discount and counts every answer token.
    assert table.worst_case_cost("gpt-4o", 1000, 1000, 0.0) == table.cost_usd("gpt-4o", 1000, 1000)


def test_a_call_with_no_answer_read_counts_its_charge_in_the_cost_metric() -> None:
    from activities.telemetry import observe_call

    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    observe_call(
        metrics,
        "deepseek",
        "deepseek-chat",
        0.5,
        error_code="CANCELLED",
        response=None,
        cost_usd=Decimal("0.0042"),
    )
    value = registry.get_sample_value(
        "aijobs_provider_cost_usd_total", {"provider": "deepseek", "model": "deepseek-chat"}
    )
    assert value == pytest.approx(0.0042)
