"""The OpenAI-compatible client against the fake server over real loopback HTTP.

Every provider behaviour maps to one error code (docs/api.md, "Errors"); the API key and prompts
never leak into exceptions. No database or Temporal is needed.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from engine.errors import ExecutionFailure, Fault, is_retryable
from providers.base import Provider, ProviderRequest
from providers.openai_compat import OpenAICompatibleProvider, parse_retry_after
from tests.fakes.openai_server import FakeOpenAIServer
from tests.support import eventually

API_KEY = "sk-test-SECRETKEY-0123456789abcdef"
SYSTEM_PROMPT = "You are a careful assistant that answers in JSON only."
USER_PROMPT = "Summarise the confidential quarterly memo about project nightingale."


def make_request(**overrides: Any) -> ProviderRequest:
    fields: dict[str, Any] = {
        "job_id": "job-1",
        "job_type": "summarise",
        "attempt": 1,
        "model": "deepseek-chat",
        "system_prompt": SYSTEM_PROMPT,
        "user_prompt": USER_PROMPT,
        "output_schema": {"type": "object"},
        "timeout_s": 10.0,
        "api_key": API_KEY,
    }
    fields.update(overrides)
    return ProviderRequest(**fields)


@pytest.fixture
async def provider(fake: FakeOpenAIServer) -> AsyncIterator[OpenAICompatibleProvider]:
    prov = OpenAICompatibleProvider(fake.base_url, name="deepseek", timeout_s=30.0)
    yield prov
    await prov.aclose()


def assert_no_secrets(exc: BaseException) -> None:
    """Neither the key (or a fragment of it) nor the prompts appear anywhere in the error."""
    texts = [str(exc), repr(exc), *(str(arg) for arg in exc.args)]
    if isinstance(exc, ExecutionFailure):
        texts += [exc.public_message, exc.internal_message or ""]
    for text in texts:
        assert API_KEY not in text
        assert "SECRETKEY" not in text
        assert "sk-test" not in text
        assert "0123456789abcdef" not in text
        assert "nightingale" not in text
        assert "careful assistant" not in text
    # No httpx object (which holds the Authorization header) is chained onto the failure.
    assert exc.__cause__ is None
    assert exc.__context__ is None


async def expect_failure(
    provider: OpenAICompatibleProvider, request: ProviderRequest | None = None
) -> ExecutionFailure:
    with pytest.raises(ExecutionFailure) as info:
        await provider.generate(request or make_request())
    assert_no_secrets(info.value)
    return info.value


def test_provider_satisfies_protocol(provider: OpenAICompatibleProvider) -> None:
    assert isinstance(provider, Provider)
    assert provider.name == "deepseek"


async def test_valid_answer_reads_content_usage_and_model(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script(
        [{"kind": "valid", "content": {"summary": "ok"}, "tokens_in": 123, "tokens_out": 45}]
    )
    response = await provider.generate(make_request(model="deepseek-chat"))
    assert json.loads(response.content) == {"summary": "ok"}
    assert (response.tokens_in, response.tokens_out) == (123, 45)
    assert response.provider == "deepseek"
    assert response.model == "deepseek-chat"
    assert response.latency_ms >= 0


async def test_authorization_header_and_model_reach_server(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    await provider.generate(make_request(model="gpt-4o-mini"))
    calls = fake.calls()
    assert calls["count"] == 1
    assert calls["authorizations"] == [f"Bearer {API_KEY}"]
    assert calls["models"] == ["gpt-4o-mini"]


async def test_request_payload_shape() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200,
            json={"choices": [{"message": {"content": "{}"}, "finish_reason": "stop"}]},
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        prov = OpenAICompatibleProvider("https://example.invalid/v1/", client=client)
        response = await prov.generate(make_request(model="deepseek-reasoner"))
    assert str(seen[0].url) == "https://example.invalid/v1/chat/completions"
    assert seen[0].method == "POST"
    assert json.loads(seen[0].content) == {
        "model": "deepseek-reasoner",
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": USER_PROMPT},
        ],
        "response_format": {"type": "json_object"},
        "stream": False,
    }
    # No "model" and no "usage" in the answer: request model and zero tokens.
    assert response.model == "deepseek-reasoner"
    assert (response.tokens_in, response.tokens_out) == (0, 0)


async def test_missing_key_is_credential_missing_without_a_call(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    failure = await expect_failure(provider, make_request(api_key=None))
    assert failure.code == "CREDENTIAL_MISSING"
    assert fake.calls()["count"] == 0


async def test_invalid_json_and_schema_invalid_are_returned_unvalidated(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script([{"kind": "invalid_json"}, {"kind": "schema_invalid"}])
    first = await provider.generate(make_request())
    second = await provider.generate(make_request())
    assert first.content == "this is not json {"
    assert json.loads(second.content) == {"unexpected": True}


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_errors_are_credential_invalid(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider, status: int
) -> None:
    fake.script([{"kind": "status", "status": status, "message": "bad key"}])
    failure = await expect_failure(provider)
    assert failure.code == "CREDENTIAL_INVALID"
    assert str(status) in (failure.internal_message or "")


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors_are_provider_unavailable(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider, status: int
) -> None:
    fake.script([{"kind": "status", "status": status, "message": "overloaded"}])
    failure = await expect_failure(provider)
    assert failure.code == "PROVIDER_UNAVAILABLE"
    internal = failure.internal_message or ""
    assert f"HTTP {status}" in internal
    assert "overloaded" in internal  # the (scrubbed) error body snippet is kept for operators


@pytest.mark.parametrize("status", [400, 404, 409, 422])
async def test_other_client_errors_are_the_requests_own(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider, status: int
) -> None:
    """A request the provider refused as written: one attempt, never a health signal."""
    fake.script([{"kind": "status", "status": status, "message": "unknown parameter"}])
    failure = await expect_failure(provider)
    assert failure.code == "REQUEST_REJECTED"
    assert (failure.fault, failure.answered) == (Fault.REQUEST, True)
    assert not is_retryable(failure.code, attempt=1)
    assert f"HTTP {status}" in (failure.internal_message or "")
    assert "rejected" in (failure.internal_message or "")
    assert "input" in failure.public_message  # tells the user what to change


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (400, "This model's maximum context length is 65536 tokens."),
        (400, "Request too long"),
        (422, "context_length_exceeded"),
        (413, "payload too large"),
    ],
)
async def test_a_request_too_large_for_the_model_says_so(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider, status: int, message: str
) -> None:
    fake.script([{"kind": "status", "status": status, "message": message}])
    failure = await expect_failure(provider)
    assert failure.code == "REQUEST_TOO_LARGE"
    assert failure.fault is Fault.REQUEST
    assert not is_retryable(failure.code, attempt=1)
    assert "too long" in failure.public_message and "Shorten" in failure.public_message


async def test_insufficient_balance_is_the_keys_problem(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script([{"kind": "status", "status": 402, "message": "Insufficient Balance"}])
    failure = await expect_failure(provider)
    assert failure.code == "CREDENTIAL_INSUFFICIENT_BALANCE"
    assert (failure.fault, failure.answered) == (Fault.KEY, True)
    assert not is_retryable(failure.code, attempt=1)
    assert "balance" in failure.public_message


async def test_a_429_for_an_exhausted_quota_is_the_keys_problem_not_a_pause(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script(
        [{"kind": "status", "status": 429, "code": "insufficient_quota", "message": "quota"}]
    )
    failure = await expect_failure(provider)
    assert failure.code == "CREDENTIAL_INSUFFICIENT_BALANCE"
    assert failure.fault is Fault.KEY


@pytest.mark.parametrize("status", [500, 503])
async def test_server_errors_are_health_failures(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider, status: int
) -> None:
    fake.script([{"kind": "status", "status": status}])
    failure = await expect_failure(provider)
    assert failure.fault is Fault.PROVIDER
    assert is_retryable(failure.code, attempt=1)


async def test_error_body_snippet_is_bounded(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script([{"kind": "status", "status": 500, "message": "x" * 5000}])
    failure = await expect_failure(provider)
    assert failure.internal_message is not None
    assert failure.internal_message.count("x") <= 200


@pytest.mark.parametrize(
    "step",
    [
        {"kind": "status", "status": 400, "code": "content_filter", "message": "nope"},
        {"kind": "status", "status": 400, "message": "Blocked by the content filter."},
        {"kind": "content_filter"},
    ],
)
async def test_content_filter_is_content_safety_blocked(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider, step: dict[str, Any]
) -> None:
    fake.script([step])
    failure = await expect_failure(provider)
    assert failure.code == "CONTENT_SAFETY_BLOCKED"


async def test_plain_bad_request_is_not_content_safety(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script([{"kind": "status", "status": 400, "code": "invalid_request_error"}])
    failure = await expect_failure(provider)
    assert failure.code == "REQUEST_REJECTED"


async def test_malformed_success_is_provider_unavailable(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script([{"kind": "malformed"}])
    failure = await expect_failure(provider)
    assert failure.code == "PROVIDER_UNAVAILABLE"
    assert "malformed response" in (failure.internal_message or "")
    # Retried, but the provider answered: no outage signal for the breaker.
    assert (failure.fault, failure.answered) == (Fault.REQUEST, True)


@pytest.mark.parametrize(
    "body",
    [
        "not json at all",
        "[1, 2]",
        '{"choices": []}',
        '{"choices": [{"finish_reason": "stop"}]}',
        '{"choices": [{"message": {"content": null}, "finish_reason": "stop"}]}',
    ],
)
async def test_malformed_bodies_via_mock_transport(body: str) -> None:
    transport = httpx.MockTransport(lambda _request: httpx.Response(200, text=body))
    async with httpx.AsyncClient(transport=transport) as client:
        prov = OpenAICompatibleProvider("https://example.invalid", client=client)
        failure = await expect_failure(prov)
    assert failure.code == "PROVIDER_UNAVAILABLE"
    assert "malformed response" in (failure.internal_message or "")


async def test_rate_limited_parses_retry_after_seconds(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script([{"kind": "rate_limited", "retry_after": "7"}, {"kind": "rate_limited"}])
    first = await expect_failure(provider)
    second = await expect_failure(provider)
    assert first.code == second.code == "PROVIDER_RATE_LIMITED"
    assert first.retry_after_float == 7.0
    assert second.retry_after_float == 1.0  # the fake's default Retry-After


async def test_rate_limited_parses_http_date(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    when = datetime.now(UTC) + timedelta(seconds=120)
    fake.script(
        [{"kind": "status", "status": 429, "retry_after": format_datetime(when, usegmt=True)}]
    )
    failure = await expect_failure(provider)
    assert failure.code == "PROVIDER_RATE_LIMITED"
    assert failure.retry_after_float is not None
    assert 100 <= failure.retry_after_float <= 121


@pytest.mark.parametrize("header", [None, "soon", ""])
async def test_rate_limited_without_usable_retry_after(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider, header: str | None
) -> None:
    step: dict[str, Any] = {"kind": "status", "status": 429}
    if header is not None:
        step["retry_after"] = header
    fake.script([step])
    failure = await expect_failure(provider)
    assert failure.code == "PROVIDER_RATE_LIMITED"
    assert failure.retry_after_float is None


def test_parse_retry_after_units() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("30", now=now) == 30.0
    assert parse_retry_after(" 2.5 ", now=now) == 2.5
    assert parse_retry_after("-4", now=now) == 0.0
    assert parse_retry_after("Thu, 01 Jan 2026 12:00:45 GMT", now=now) == 45.0
    assert parse_retry_after("Thu, 01 Jan 2026 11:00:00 GMT", now=now) == 0.0  # in the past
    assert parse_retry_after("nan", now=now) is None
    assert parse_retry_after("tomorrow-ish", now=now) is None
    assert parse_retry_after(None, now=now) is None


async def test_slow_answer_with_short_request_timeout_is_provider_timeout(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script([{"kind": "slow", "delay_s": 5.0, "content": {"late": True}}])
    started = time.monotonic()
    failure = await expect_failure(provider, make_request(timeout_s=0.3))
    assert failure.code == "PROVIDER_TIMEOUT"
    assert time.monotonic() - started < 2.0


async def test_provider_timeout_caps_request_timeout(fake: FakeOpenAIServer) -> None:
    fake.script([{"kind": "slow", "delay_s": 5.0}])
    prov = OpenAICompatibleProvider(fake.base_url, timeout_s=0.3)
    try:
        started = time.monotonic()
        failure = await expect_failure(prov, make_request(timeout_s=60.0))
    finally:
        await prov.aclose()
    assert failure.code == "PROVIDER_TIMEOUT"
    assert time.monotonic() - started < 2.0


async def test_slow_answer_within_timeout_succeeds(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script([{"kind": "slow", "delay_s": 0.2, "content": {"late": True}}])
    response = await provider.generate(make_request())
    assert json.loads(response.content) == {"late": True}
    assert response.latency_ms >= 150


async def test_cancelling_generate_aborts_promptly(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    delay_s = 5.0
    fake.script([{"kind": "slow", "delay_s": delay_s}])
    started = time.monotonic()
    task = asyncio.create_task(provider.generate(make_request(timeout_s=30.0)))

    # Wait until the request is really in flight on the server.
    async def in_flight() -> bool:
        return bool((await fake.acalls())["count"] > 0)

    await eventually(in_flight, timeout=3.0, interval=0.02, what="the request to reach the server")
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert time.monotonic() - started < delay_s / 2


async def test_connection_refused_is_provider_unavailable() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # The socket is closed: nothing listens on `port` now.
    prov = OpenAICompatibleProvider(f"http://127.0.0.1:{port}/v1")
    try:
        failure = await expect_failure(prov)
    finally:
        await prov.aclose()
    assert failure.code == "PROVIDER_UNAVAILABLE"
    assert "transport error" in (failure.internal_message or "")


@pytest.mark.parametrize(
    "step",
    [
        {"kind": "status", "status": 401, "message": f"Incorrect API key provided: {API_KEY}"},
        {"kind": "status", "status": 401, "message": "Incorrect API key: sk-test-SECR***cdef"},
        {"kind": "status", "status": 500, "message": f"failed on prompt: {USER_PROMPT}"},
        {"kind": "status", "status": 404, "message": f"no model for {SYSTEM_PROMPT[:30]}"},
        {"kind": "rate_limited"},
        {"kind": "content_filter"},
        {"kind": "malformed"},
    ],
)
async def test_key_and_prompt_never_leak_into_failures(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider, step: dict[str, Any]
) -> None:
    fake.script([step])
    with pytest.raises(ExecutionFailure) as info:
        await provider.generate(make_request())
    assert_no_secrets(info.value)


async def test_timeout_and_transport_failures_do_not_leak_key(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script([{"kind": "slow", "delay_s": 3.0}])
    with pytest.raises(ExecutionFailure) as info:
        await provider.generate(make_request(timeout_s=0.2))
    assert info.value.code == "PROVIDER_TIMEOUT"
    assert_no_secrets(info.value)


async def test_owned_client_closed_but_injected_client_left_open(fake: FakeOpenAIServer) -> None:
    owned = OpenAICompatibleProvider(fake.base_url)
    await owned.aclose()
    with pytest.raises(ExecutionFailure):
        # A closed client cannot send: surfaced as a provider failure, never a crash.
        await owned.generate(make_request())

    async with httpx.AsyncClient() as client:
        injected = OpenAICompatibleProvider(fake.base_url, client=client, name="custom")
        await injected.aclose()
        assert not client.is_closed
        response = await injected.generate(make_request())
        assert response.provider == "custom"


async def test_fake_server_queue_default_and_async_helpers() -> None:
    async with FakeOpenAIServer() as server:
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
        await server.ascript(
            [{"kind": "valid", "content": {"n": 1}}, {"kind": "valid", "content": {"n": 2}}],
            default={"kind": "valid", "content": {"n": 0}},
        )
        # The un-prefixed path works too.
        prov = OpenAICompatibleProvider(server.root_url, name="openai_compatible")
        try:
            contents = [json.loads((await prov.generate(make_request())).content) for _ in range(4)]
        finally:
            await prov.aclose()
        assert contents == [{"n": 1}, {"n": 2}, {"n": 0}, {"n": 0}]
        assert (await server.acalls())["count"] == 4
        await server.areset()
        assert await server.acalls() == {"count": 0, "authorizations": [], "models": []}


def test_fake_server_rejects_unknown_step_kind(fake: FakeOpenAIServer) -> None:
    with pytest.raises(httpx.HTTPStatusError) as info:
        fake.script([{"kind": "explode"}])
    assert info.value.response.status_code == 422


def test_fake_server_stops_and_frees_port() -> None:
    server = FakeOpenAIServer()
    server.start()
    port = server.port
    server.stop()
    with pytest.raises(RuntimeError):
        _ = server.base_url
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/_calls", trust_env=False)


# --- usage detail: cached prompt tokens and reasoning tokens -----------------------------


async def test_openai_usage_details_are_read(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    details = {
        "prompt_tokens_details": {"cached_tokens": 64},
        "completion_tokens_details": {"reasoning_tokens": 30},
    }
    fake.script([{"kind": "valid", "tokens_in": 100, "tokens_out": 45, "usage_extra": details}])
    response = await provider.generate(make_request())
    assert (response.tokens_in, response.tokens_out) == (100, 45)
    assert (response.cached_input_tokens, response.reasoning_tokens) == (64, 30)


async def test_deepseek_cache_hit_tokens_are_read(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    hits = {"prompt_cache_hit_tokens": 70, "prompt_cache_miss_tokens": 30}
    fake.script([{"kind": "valid", "tokens_in": 100, "tokens_out": 5, "usage_extra": hits}])
    response = await provider.generate(make_request())
    assert (response.tokens_in, response.cached_input_tokens) == (100, 70)
    assert response.reasoning_tokens == 0


def test_usage_parsing_edges() -> None:
    from providers.base import Usage
    from providers.openai_stream import parse_usage

    assert parse_usage(None) is None
    assert parse_usage({}) == Usage(0, 0)
    # DeepSeek without prompt_tokens: hit + miss; garbage counts 0; parts cut to their whole.
    assert parse_usage(
        {"prompt_cache_hit_tokens": 3, "prompt_cache_miss_tokens": 4, "completion_tokens": 2}
    ) == Usage(7, 2, 3, 0)
    assert parse_usage(
        {
            "prompt_tokens": 5,
            "completion_tokens": "x",
            "prompt_tokens_details": {"cached_tokens": 9},
            "completion_tokens_details": {"reasoning_tokens": True},
        }
    ) == Usage(5, 0, 5, 0)
