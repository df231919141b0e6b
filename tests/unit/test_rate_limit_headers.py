"""OpenAI's `x-ratelimit-*` headers are read from every answer, durations in Go's notation or
plain seconds; a header that does not parse is ignored and never fails the call."""

from __future__ import annotations

import json

import httpx
import pytest

from db.provider_limits import Limits, LimitTable, parse_model_limits
from engine.settings import Settings
from providers.base import ProviderRequest, RateLimitHeaders
from providers.openai_compat import (
    OpenAICompatibleProvider,
    parse_duration_s,
    parse_rate_limit_headers,
)
from runtime.wiring import engine_config


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("2", 2.0),
        ("0.5", 0.5),
        (" 7s ", 7.0),
        ("1m30.5s", 90.5),
        ("250us", 0.00025),
        ("0s", 0.0),
    ],
)
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", [None, "", "soon", "1x", "s", "-1s", "-2", "nan", "inf", "1s garbage", "2d", "99999h"]
)
def test_bad_durations_are_ignored(text: str | None) -> None:
    assert parse_duration_s(text) is None


def test_all_six_headers() -> None:
    got = parse_rate_limit_headers(
        httpx.Headers(
            {
                "X-RateLimit-Limit-Requests": "500",
                "x-ratelimit-limit-tokens": "200000",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-remaining-tokens": "199000",
                "x-ratelimit-reset-requests": "125ms",
                "x-ratelimit-reset-tokens": "6m0s",
            }
        )
    )
    assert got == RateLimitHeaders(
        limit_requests=500,
        limit_tokens=200_000,
        remaining_requests=0,
        remaining_tokens=199_000,
        reset_requests_s=0.125,
        reset_tokens_s=360.0,
    )


def test_garbage_headers_are_ignored_one_by_one() -> None:
    got = parse_rate_limit_headers(
        {
            "x-ratelimit-limit-requests": "lots",
            "x-ratelimit-limit-tokens": "-5",
            "x-ratelimit-remaining-requests": "3.5",
            "x-ratelimit-remaining-tokens": "99999999999999",
            "x-ratelimit-reset-requests": "tomorrow",
            "x-ratelimit-reset-tokens": "1s",
        }
    )
    assert got == RateLimitHeaders(reset_tokens_s=1.0)
    assert parse_rate_limit_headers({"x-ratelimit-limit-requests": "?"}) is None
    assert parse_rate_limit_headers({}) is None


def _request() -> ProviderRequest:
    return ProviderRequest(
        job_id="j",
        job_type="t",
        attempt=1,
        model="m",
        system_prompt="s",
        user_prompt="u",
        output_schema={},
        timeout_s=5,
        api_key="sk-test",
    )


def _answer(headers: dict[bytes, bytes]) -> httpx.MockTransport:
    body = {
        "model": "m",
        "choices": [{"message": {"content": "{}"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }

    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=json.dumps(body), headers=headers)

    return httpx.MockTransport(handler)


async def test_every_answer_carries_its_headers_and_garbage_never_fails_the_call() -> None:
    headers = {b"x-ratelimit-remaining-requests": b"0", b"x-ratelimit-reset-requests": b"2s"}
    async with httpx.AsyncClient(transport=_answer(headers)) as client:
        provider = OpenAICompatibleProvider("http://provider.test", client=client)
        answered = await provider.generate(_request())
    assert answered.rate_limit == RateLimitHeaders(remaining_requests=0, reset_requests_s=2.0)

    bad = {b"x-ratelimit-remaining-requests": b"\xff\xfe", b"x-ratelimit-reset-requests": b"2 s"}
    async with httpx.AsyncClient(transport=_answer(bad)) as client:
        provider = OpenAICompatibleProvider("http://provider.test", client=client)
        answered = await provider.generate(_request())
    assert answered.content == "{}" and answered.rate_limit is None


def test_model_limits_setting() -> None:
    table = parse_model_limits(
        '{"deepseek-chat": {"rpm": 60, "tpm": 100000}, "openai/GPT-4o": {"concurrency": 2},'
        ' "*": {"rpm": 1000, "tpm": null}}'
    )
    assert table.for_model("deepseek", "deepseek-chat") == Limits(rpm=60, tpm=100_000)
    assert table.for_model("OpenAI", "gpt-4o") == Limits(concurrency=2)
    assert table.for_model("azure", "gpt-4o") == Limits(rpm=1000)  # "*": every other model
    assert not parse_model_limits("")
    assert LimitTable().for_model("p", "m") == Limits()
    assert not Limits().configured


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("{", "AI_MODEL_LIMITS: not valid JSON"),
        ("[]", "AI_MODEL_LIMITS: want a JSON object"),
        ('{"m": {"rpm": 0}}', "AI_MODEL_LIMITS['m'].rpm"),
        ('{"m": {"tpm": "lots"}}', "AI_MODEL_LIMITS['m'].tpm"),
        ('{"m": {"concurrency": true}}', "AI_MODEL_LIMITS['m'].concurrency"),
        ('{"m": {"rps": 3}}', "AI_MODEL_LIMITS['m']"),
        ('{"m": 5}', "AI_MODEL_LIMITS['m']"),
        ('{" ": {}}', "AI_MODEL_LIMITS: a model name"),
    ],
)
def test_malformed_model_limits_name_the_entry(text: str, names: str) -> None:
    with pytest.raises(ValueError, match="^" + names.replace("[", r"\[").replace(".", r"\.")):
        parse_model_limits(text)


def test_a_worker_is_built_with_the_setting_and_refuses_a_malformed_one() -> None:
    good = Settings.model_validate(
        {"AIJOBS_ENV": "test", "AI_MODEL_LIMITS": '{"synthetic": {"concurrency": 1}}'}
    )
    assert engine_config(good).model_limits.for_model("synthetic", "synthetic") == Limits(
        concurrency=1
    )
    assert not engine_config(Settings.model_validate({"AIJOBS_ENV": "test"})).model_limits
    bad = Settings.model_validate({"AIJOBS_ENV": "test", "AI_MODEL_LIMITS": '{"x": {"rpm": -1}}'})
    with pytest.raises(ValueError, match=r"AI_MODEL_LIMITS\['x'\]\.rpm"):
        engine_config(bad)
