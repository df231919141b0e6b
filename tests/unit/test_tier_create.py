"""A create at a tier is priced and reserved at that tier's price, and a batch create whose
provider has no batch API is refused naming the provider: never silently run at standard."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import pytest

from engine.definition import PLATFORM_KEY, USER_DEEPSEEK_KEY
from engine.errors import CostCapTooLow, ValidationFailed
from engine.settings import Settings
from jobs.policy import CreatePolicy, ProviderTraits
from jobs.requests import CheckedRequest, CreateJobRequest, RequestChecker
from jobs.types import default_catalog
from providers.batch import has_batch_api
from providers.factory import build_provider
from providers.openai_compat import OpenAICompatibleProvider
from providers.synthetic import SyntheticProvider
from runtime.wiring import create_policy, provider_traits

CARDS = {"sourceText": "Ribosomes assemble proteins from amino acids. " * 20, "count": 5}
OPENAI = {PLATFORM_KEY: ProviderTraits("openai_compatible", batch_api=True)}
HALF = Decimal("0.5")


def policy(**kw: Any) -> CreatePolicy:
    base: dict[str, Any] = {
        "model": "gpt-4o-mini",
        "platform_synthetic": False,
        "providers": OPENAI,
    }
    return CreatePolicy(**(base | kw))


def check(p: CreatePolicy, **kw: Any) -> CheckedRequest:
    req = CreateJobRequest(
        user_id="u1",
        job_type="flashcard_generation",
        target_type="t",
        target_id="1",
        input=CARDS,
        **kw,
    )
    return RequestChecker(default_catalog(), p).check(req)


def refusal(p: CreatePolicy, **kw: Any) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as info:
        check(p, **kw)
    return info.value


def test_has_batch_api_is_the_generic_openai_compatible_provider_only() -> None:
    assert has_batch_api(
        OpenAICompatibleProvider("https://api.example/v1", name="openai_compatible")
    )
    assert not has_batch_api(OpenAICompatibleProvider("https://api.deepseek.com", name="deepseek"))
    assert not has_batch_api(SyntheticProvider())
    assert has_batch_api(build_provider(api_key="k", base_url="https://llm.example/v1"))
    assert not has_batch_api(build_provider(api_key="k", base_url=None))


def test_the_wiring_describes_each_mode_s_provider() -> None:
    offline = provider_traits(Settings())
    assert offline[PLATFORM_KEY] == ProviderTraits("synthetic", batch_api=False)
    assert offline[USER_DEEPSEEK_KEY] == ProviderTraits("deepseek", batch_api=False)
    generic = Settings(AI_BASE_URL="https://llm.example/v1", DEEPSEEK_API_KEY="k")
    assert provider_traits(generic)[PLATFORM_KEY] == ProviderTraits("openai_compatible", True)
    assert create_policy(generic).providers[PLATFORM_KEY].batch_api
    deepseek = Settings(DEEPSEEK_API_KEY="k")
    assert not provider_traits(deepseek)[PLATFORM_KEY].batch_api


@pytest.mark.parametrize(
    ("p", "mode", "provider"),
    [
        (CreatePolicy(model="gpt-4o-mini"), PLATFORM_KEY, "synthetic"),
        (policy(providers={PLATFORM_KEY: ProviderTraits("deepseek")}), PLATFORM_KEY, "deepseek"),
        (policy(), USER_DEEPSEEK_KEY, "deepseek"),
    ],
)
def test_batch_on_a_provider_without_a_batch_api_is_refused_naming_it(
    p: CreatePolicy, mode: str, provider: str
) -> None:
    err = refusal(p, service_tier="batch", credential_mode=mode)
    assert err.errors[0]["loc"] == ["serviceTier"]
    assert f"({provider})" in err.public_message and "batch API" in err.public_message
    # The same job at standard is fine.
    assert check(p, credential_mode=mode).service_tier == "standard"


def test_a_batch_create_reserves_half_the_standard_price() -> None:
    standard = check(policy()).estimate
    batch = check(policy(), service_tier="batch").estimate
    assert batch.worst_case_cost_usd == pytest.approx(
        standard.worst_case_cost_usd * HALF, abs=Decimal("1e-8")
    )
    assert batch.estimated_cost_usd == pytest.approx(
        standard.estimated_cost_usd * HALF, abs=Decimal("1e-8")
    )


def test_a_batch_job_has_no_fallback_chain_price() -> None:
    # gpt-4o as a fallback is dearer; a standard job reserves at it, a batch job does not.
    p = policy(fallback_models=("gpt-4o",))
    standard = check(p).estimate
    batch = check(p, service_tier="batch").estimate
    alone = check(policy(), service_tier="batch").estimate
    assert batch.worst_case_cost_usd == alone.worst_case_cost_usd
    assert batch.worst_case_cost_usd * 4 < standard.worst_case_cost_usd


def test_an_offpeak_create_reserves_at_the_window_price_unless_it_may_run_at_standard() -> None:
    p = policy(providers={}, model="deepseek-chat", offpeak_discounts={"deepseek": HALF})
    standard = check(p).estimate.worst_case_cost_usd
    held = check(p, service_tier="offpeak").estimate.worst_case_cost_usd
    assert held == pytest.approx(standard * HALF, abs=Decimal("1e-8"))
    may_run = check(p, service_tier="offpeak", offpeak_on_deadline="standard").estimate
    assert may_run.worst_case_cost_usd == standard
    # A provider with no window: the standard price.
    no_window = policy(providers={}, model="deepseek-chat")
    assert check(no_window, service_tier="offpeak").estimate.worst_case_cost_usd == standard


def test_the_tier_prices_show_each_tier_and_whether_it_is_available() -> None:
    checked = check(policy())
    prices = {t.service_tier: t for t in checked.tier_prices}
    assert list(prices) == ["standard", "batch", "offpeak"]
    assert prices["standard"].worst_case_cost_usd == checked.estimate.worst_case_cost_usd
    assert (
        prices["batch"].worst_case_cost_usd
        == check(policy(), service_tier="batch").estimate.worst_case_cost_usd
    )
    assert prices["standard"].available and prices["batch"].available
    assert not prices["offpeak"].available  # no discount window for this provider
    deepseek = {t.service_tier: t for t in check(policy(providers={})).tier_prices}
    assert not deepseek["batch"].available
    quiz = RequestChecker(default_catalog(), policy()).check(
        CreateJobRequest(
            user_id="u1",
            job_type="quiz_generation",
            target_type="t",
            target_id="1",
            input={"sourceText": "Ribosomes assemble proteins.", "count": 1},
        )
    )
    assert [t.available for t in quiz.tier_prices] == [True, False, False]


def test_a_cap_only_the_batch_price_fits_leaves_standard_unavailable() -> None:
    standard = check(policy()).estimate
    # The smallest useful job at the full price (the prompt with its margin and 256 answer
    # tokens); three quarters of it fits at half price only.
    padded = math.ceil(standard.input_tokens * 1.25)
    smallest = (Decimal(padded) * Decimal("0.15") + 256 * Decimal("0.60")) / 1_000_000
    cap = (smallest * Decimal("0.75")).quantize(Decimal("0.00000001"))
    with pytest.raises(CostCapTooLow):
        check(policy(), max_cost_usd=cap)
    checked = check(policy(), service_tier="batch", max_cost_usd=cap)
    prices = {t.service_tier: t for t in checked.tier_prices}
    assert checked.estimate.worst_case_cost_usd <= cap
    assert prices["batch"].available
    assert not prices["standard"].available


def test_the_refusal_points_to_offpeak_only_where_a_window_serves_it() -> None:
    windowed = policy(providers={}, offpeak_discounts={"deepseek": HALF})
    assert "or offpeak" in refusal(windowed, service_tier="batch").public_message
    assert "or offpeak" not in refusal(policy(providers={}), service_tier="batch").public_message
