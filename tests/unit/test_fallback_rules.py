"""Provider fallback's rules without I/O: AI_FALLBACKS validation (an entry named, its key
never), which failures move a call, whose jobs have a chain, and the reservation's price over
the chain."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal

import pytest

from engine.definition import JobDefinition
from engine.errors import ExecutionFailure, Fault
from engine.settings import Settings
from jobs import fallback
from jobs.costs import chain_price, estimate_job
from jobs.gateway import Gateway
from jobs.policy import CreatePolicy
from jobs.requests import CreateJobRequest, RequestChecker
from jobs.types import default_catalog
from jobs.types import quiz_generation as quiz
from providers.fallback import Fallbacks, falls_back, parse_fallbacks, reason_of, select
from providers.openai_compat import OpenAICompatibleProvider
from providers.pricing import PriceTable

KEY = "sk-secret-fallback-key-9999"


def _entry(**over: object) -> dict[str, object]:
    return {"model": "gpt-4o-mini", "baseUrl": "https://api.openai.com/v1", "apiKey": KEY, **over}


def test_entries_parse_with_their_key_hidden() -> None:
    [e] = parse_fallbacks(json.dumps([_entry(extra="ignored")]))
    assert (e.position, e.model, e.base_url, e.key_ref) == (
        1,
        "gpt-4o-mini",
        "https://api.openai.com/v1",
        "fallback:1",
    )
    assert e.provider == "openai_compatible"
    assert e.api_key.get_secret_value() == KEY
    assert KEY not in repr(e) and KEY not in str(e)
    assert parse_fallbacks("") == () and parse_fallbacks(None) == ()
    deepseek = parse_fallbacks(json.dumps([_entry(baseUrl="https://api.deepseek.com/v1")]))
    assert deepseek[0].provider == "deepseek"


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ("{", "not valid JSON"),
        ("{}", "JSON list"),
        ([_entry(model="")], "entry 1: model"),
        ([_entry(), _entry(model="b", baseUrl="https://x.example/api")], "entry 2 (model 'b')"),
        ([_entry(baseUrl="ftp://x/v1")], "http(s)"),
        ([_entry(baseUrl=f"https://user:{KEY}@x.example/v1")], "credentials"),
        ([_entry(apiKey="")], "apiKey"),
        ([_entry(), _entry(baseUrl="https://other.example/v1")], "once"),
    ],
)
def test_a_bad_entry_is_named_and_its_key_never_printed(entries: object, says: str) -> None:
    text = entries if isinstance(entries, str) else json.dumps(entries)
    with pytest.raises(ValueError) as raised:
        parse_fallbacks(text)
    assert says in str(raised.value) and "AI_FALLBACKS" in str(raised.value)
    assert KEY not in str(raised.value)


def test_the_setting_is_a_secret() -> None:
    s = Settings.model_validate({"AI_FALLBACKS": json.dumps([_entry()])})
    assert KEY not in repr(s) and KEY not in str(s.model_dump())
    assert len(parse_fallbacks(s.ai_fallbacks)) == 1


@pytest.mark.parametrize(
    ("code", "message", "fault", "moves"),
    [
        ("PROVIDER_UNAVAILABLE", "HTTP 503 server error", None, True),
        ("PROVIDER_UNAVAILABLE", "transport error: ConnectError", None, True),
        ("PROVIDER_TIMEOUT", "no answer within 5s", None, True),
        ("PROVIDER_RATE_LIMITED", "HTTP 429", None, False),
        ("REQUEST_REJECTED", "HTTP 400", None, False),
        ("REQUEST_TOO_LARGE", "HTTP 413", None, False),
        ("CREDENTIAL_INVALID", "HTTP 401", None, False),
        ("CREDENTIAL_INSUFFICIENT_BALANCE", "HTTP 402", None, False),
        ("CONTENT_SAFETY_BLOCKED", "HTTP 400", None, False),
        ("PROVIDER_UNAVAILABLE", "HTTP 500", Fault.REQUEST, False),
    ],
)
def test_only_health_failures_move_a_call(
    code: str, message: str, fault: Fault | None, moves: bool
) -> None:
    assert falls_back(ExecutionFailure(code, internal_message=message, fault=fault)) is moves


def test_reasons_are_a_fixed_set() -> None:
    assert reason_of(ExecutionFailure("PROVIDER_UNAVAILABLE", internal_message="HTTP 503")) == "5xx"
    assert reason_of(ExecutionFailure("PROVIDER_TIMEOUT")) == "timeout"
    assert reason_of(ExecutionFailure("PROVIDER_UNAVAILABLE", internal_message="x")) == (
        "unavailable"
    )


def test_a_job_type_keeps_its_own_chain_or_none() -> None:
    models = ["gpt-4o-mini", "deepseek-reasoner", "gpt-4o"]
    assert select(models, "default") == (0, 1, 2)
    assert select(models, "none") == ()
    assert select(models, ("GPT-4o", "gpt-4o-mini", "unknown")) == (2, 0)
    d = JobDefinition.model_validate({"jobType": "x_type", "fallback": "none"})
    assert d.fallback == "none"


def _jt(choice: str | tuple[str, ...]) -> object:
    definition = quiz.JOB.definition.model_copy(update={"fallback": choice})
    return dataclasses.replace(quiz.JOB, definition=definition)


def test_user_key_jobs_and_opted_out_types_have_no_chain() -> None:
    entries = parse_fallbacks(
        json.dumps([_entry(), _entry(model="gpt-4o", baseUrl="https://b.example/v1")])
    )
    gw = Gateway(
        provider=OpenAICompatibleProvider("http://127.0.0.1:1/v1", name="openai_compatible"),
        model="deepseek-chat",
        fallbacks=Fallbacks(entries),
    )
    chain = [e.model for e in fallback.chain(gw, _jt("default"), "platform_key")]  # type: ignore[arg-type]
    assert chain == ["gpt-4o-mini", "gpt-4o"]
    assert fallback.chain(gw, _jt("default"), "user_deepseek_key") == ()  # type: ignore[arg-type]
    assert fallback.chain(gw, _jt("none"), "platform_key") == ()  # type: ignore[arg-type]
    own = fallback.chain(gw, _jt(("gpt-4o",)), "platform_key")  # type: ignore[arg-type]
    assert [e.model for e in own] == ["gpt-4o"]


def test_the_reservation_price_bounds_every_model_of_the_chain() -> None:
    prices = PriceTable()
    models = ("deepseek-chat", "gpt-4o-mini", "gpt-4o")
    price = chain_price(prices, models)
    for prompt, budget in ((1000, 4096), (50_000, 256), (0, 1)):
        bound = estimate_job(
            [prompt],
            model="x",
            price=price,
            output_budget=budget,
            expected_output_tokens=1,
            margin=0.25,
        ).worst_case_cost_usd
        for m in models:
            assert prices.worst_case_cost(m, prompt, budget, 0.25) <= bound
    assert chain_price(prices, ("deepseek-chat",)) == prices.price_for("deepseek-chat")


def test_create_reserves_the_chain_s_dearest_worst_case() -> None:
    catalog = default_catalog()
    base = CreatePolicy(model="deepseek-chat", platform_synthetic=False)
    req = CreateJobRequest(
        user_id="u1",
        job_type="quiz_generation",
        target_type="t",
        target_id="1",
        input={"sourceText": "Ribosomes assemble proteins.", "count": 1},
    )
    alone = RequestChecker(catalog, base).check(req).estimate.worst_case_cost_usd
    chained = (
        RequestChecker(catalog, dataclasses.replace(base, fallback_models=("gpt-4o",)))
        .check(req)
        .estimate.worst_case_cost_usd
    )
    assert chained > alone > Decimal(0)
    prices = PriceTable()
    assert chained >= prices.worst_case_cost("gpt-4o", 1, 4096, 0.25)
