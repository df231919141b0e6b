"""What a provider call is charged however it ended (jobs/charging.py): an answer read whole at
its echo's price (an unknown echo at the requested model's, which the reservation used), with
cached and reasoning tokens; a cut call on the engine's bound, never less than the reservation
assumed it might cost; a call never sent, nothing. The estimated-call and unknown-echo metrics
bound their labels."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from prometheus_client import CollectorRegistry

from activities.metrics import WorkerMetrics
from activities.metrics_money import UNKNOWN_ECHO_LABELS
from engine.errors import ExecutionFailure
from jobs.charging import Bound, Charged, charge
from jobs.costs import call_worst_case_usd
from providers.base import CallProgress, ProviderRequest, ProviderResponse, Usage
from providers.openai_compat import OpenAICompatibleProvider
from providers.pricing import PriceTable
from tests.fakes.openai_server import FakeOpenAIServer

BOUND = Bound(prompt_tokens=1000, max_output_tokens=4096, margin=0.25)


def answer(model: str, tin: int, tout: int, **kw: object) -> ProviderResponse:
    return ProviderResponse("{}", tin, tout, "deepseek", model, 5, **kw)  # type: ignore[arg-type]


def test_an_answer_read_whole_is_charged_its_usage_at_the_echoed_models_price() -> None:
    prices = PriceTable(warn=False)
    c = charge(prices, "gpt-4o-mini", answer("gpt-4o-mini-2024-07-18", 1200, 800), None, BOUND)
    assert c == Charged(
        "gpt-4o-mini-2024-07-18", "gpt-4o-mini", 1200, 800, 0, 0, Decimal("0.00066"), "reported"
    )


def test_an_unknown_echo_is_priced_as_the_requested_model_and_counted() -> None:
    echoes: list[str] = []
    unpriced: list[str] = []
    prices = PriceTable(warn=False, on_unknown_echo=echoes.append, on_unpriced=unpriced.append)
    c = charge(prices, "deepseek-chat", answer("m", 1000, 1000), None, BOUND)
    assert c is not None and (c.model, c.priced_as, c.basis) == ("m", "deepseek-chat", "reported")
    # deepseek-chat: 0.27 in, 1.10 out per million; never the (dearer) fallback.
    assert c.cost_usd == Decimal("0.00137")
    assert echoes == ["m"] and unpriced == []


def test_cached_and_reasoning_tokens_are_priced_by_the_table_and_never_twice() -> None:
    prices = PriceTable(warn=False)
    got = answer("deepseek-reasoner", 1000, 500, cached_input_tokens=600, reasoning_tokens=300)
    c = charge(prices, "deepseek-reasoner", got, None, BOUND)
    assert c is not None and (c.cached_input_tokens, c.reasoning_tokens) == (600, 300)
    # 400 at 0.55, 600 cached at 0.14, 500 (reasoning included) at 2.19, per million.
    expected = (400 * Decimal("0.55") + 600 * Decimal("0.14") + 500 * Decimal("2.19")) / 10**6
    assert c.cost_usd == expected.quantize(Decimal("0.00000001"))


def test_nothing_sent_is_not_charged() -> None:
    assert charge(PriceTable(warn=False), "deepseek-chat", None, CallProgress(), BOUND) is None
    assert charge(PriceTable(warn=False), "deepseek-chat", None, None, BOUND) is None


def test_a_call_of_which_nothing_was_read_costs_the_quotes_worst_case() -> None:
    prices = PriceTable(warn=False)
    c = charge(prices, "deepseek-chat", None, CallProgress(request_sent=True), BOUND)
    worst = call_worst_case_usd(1000, 4096, price=prices.price_for("deepseek-chat"), margin=0.25)
    assert c is not None and c.basis == "estimated"
    assert (c.tokens_in, c.tokens_out) == (1250, 4096)
    assert c.cost_usd == worst == prices.worst_case_cost("deepseek-chat", 1000, 4096, 0.25)
    assert (c.model, c.priced_as) == ("deepseek-chat", "deepseek-chat")


def test_usage_seen_before_the_cut_is_what_is_charged() -> None:
    progress = CallProgress(request_sent=True, status=200, usage=Usage(900, 40, 100, 10))
    c = charge(PriceTable(warn=False), "deepseek-chat", None, progress, BOUND)
    assert c is not None and c.basis == "reported"
    assert (c.tokens_in, c.tokens_out, c.cached_input_tokens, c.reasoning_tokens) == (
        900,
        40,
        100,
        10,
    )


def test_an_error_answer_read_to_its_end_is_what_the_provider_said() -> None:
    progress = CallProgress(request_sent=True, status=503, finished=True)
    c = charge(PriceTable(warn=False), "deepseek-chat", None, progress, BOUND)
    assert c is not None and (c.basis, c.cost_usd) == ("reported", Decimal(0))


def test_an_answer_without_usage_is_charged_on_the_estimate_at_the_requested_price() -> None:
    progress = CallProgress(True, 200, None, 40, 10, True)
    got = answer("some-proxy-id", 0, 0, usage_reported=False)
    c = charge(PriceTable(warn=False), "deepseek-chat", got, progress, BOUND)
    assert c is not None and c.basis == "estimated"
    assert (c.model, c.priced_as, c.tokens_in, c.tokens_out) == (
        "some-proxy-id",
        "deepseek-chat",
        1250,
        13,
    )
    # A provider that keeps no progress: what it answered is what was read.
    c2 = charge(PriceTable(warn=False), "deepseek-chat", got, None, BOUND)
    assert c2 is not None and c2.basis == "estimated" and c2.tokens_out == 2


async def test_a_stream_cut_over_http_is_charged_the_prompt_and_what_was_received(
    fake: FakeOpenAIServer,
) -> None:
    content = json.dumps({"questions": [{"q": f"q{n}", "a": f"a{n}"} for n in range(6)]})
    fake.script([{"kind": "valid", "content": json.loads(content), "cut_after": 2}])
    prov = OpenAICompatibleProvider(fake.base_url, name="deepseek", timeout_s=10.0)
    progress = CallProgress()
    req = ProviderRequest(
        "job-1", "quiz", 1, "deepseek-chat", "sys", "user", {}, 10.0, "sk-x", stream=True,
        progress=progress,
    )  # fmt: skip
    try:
        with pytest.raises(ExecutionFailure):
            await prov.generate(req)
    finally:
        await prov.aclose()
    c = charge(PriceTable(warn=False), "deepseek-chat", None, progress, BOUND)
    assert c is not None and c.basis == "estimated"
    # 16 characters received (two pieces of 8): 4 tokens, with the margin 5; never the budget.
    assert (c.tokens_in, c.tokens_out) == (1250, 5)
    assert 0 < c.cost_usd < PriceTable().worst_case_cost("deepseek-chat", 1000, 4096, 0.25)


def test_the_metrics_count_estimated_calls_and_bound_the_echo_labels() -> None:
    reg = CollectorRegistry()
    m = WorkerMetrics(reg)
    est = Charged("m", "deepseek-chat", 1, 1, 0, 0, Decimal(1), "estimated")
    m.money.charged("deepseek", "deepseek-chat", est)
    m.money.charged("deepseek", "deepseek-chat", None)  # never sent: not counted
    labels = {"provider": "deepseek", "model": "deepseek-chat"}
    assert reg.get_sample_value("aijobs_provider_calls_estimated_total", labels) == 1
    for n in range(UNKNOWN_ECHO_LABELS + 5):
        m.money.unknown_echo(f"echo-{n}")
    assert reg.get_sample_value("aijobs_unknown_model_echoes_total", {"model": "other"}) == 5
    assert reg.get_sample_value("aijobs_unknown_model_echoes_total", {"model": "echo-0"}) == 1
