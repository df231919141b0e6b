"""Streamed calls of the OpenAI-compatible provider against the fake server over real loopback
HTTP: the joined answer and its final-chunk usage, a plain JSON answer to a streamed request,
a cancel, a timeout or a cut mid-stream, and what the call's CallProgress says after each (what
the engine charges, providers.base.charge_for). No database or Temporal."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from engine.errors import ExecutionFailure
from providers.base import CallProgress, Charge, ProviderRequest, Usage, charge_for
from providers.openai_compat import OpenAICompatibleProvider, parse_model_set
from tests.fakes.openai_server import FakeOpenAIServer
from tests.support import eventually

API_KEY = "sk-test-STREAMKEY-0123456789abcdef"
SYSTEM_PROMPT = "You are a careful assistant that answers in JSON only."
USER_PROMPT = "Write questions about the confidential memo on project nightingale."

ANSWER = {"questions": [{"q": f"question {n}", "a": f"answer {n}"} for n in range(6)]}
TEXT = json.dumps(ANSWER)


@pytest.fixture
async def provider(fake: FakeOpenAIServer) -> AsyncIterator[OpenAICompatibleProvider]:
    prov = OpenAICompatibleProvider(fake.base_url, name="deepseek", timeout_s=30.0)
    yield prov
    await prov.aclose()


def make_request(**overrides: Any) -> ProviderRequest:
    fields: dict[str, Any] = {
        "job_id": "job-1",
        "job_type": "quiz",
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


def assert_no_secrets(exc: BaseException) -> None:
    """Neither the key nor the prompts appear in the error, and nothing is chained onto it."""
    texts = [str(exc), repr(exc), *(str(arg) for arg in exc.args)]
    if isinstance(exc, ExecutionFailure):
        texts += [exc.public_message, exc.internal_message or ""]
    for text in texts:
        assert "STREAMKEY" not in text and "nightingale" not in text
    assert exc.__cause__ is None and exc.__context__ is None


async def _until(condition: Callable[[], bool]) -> None:
    async def probe() -> bool:
        return condition()

    await eventually(probe, what="the call to get there")


def streamed(progress: CallProgress | None = None, **fields: Any) -> ProviderRequest:
    return make_request(stream=True, progress=progress or CallProgress(), **fields)


async def test_a_streamed_answer_is_joined_with_the_usage_of_its_last_chunk(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    details = {
        "prompt_tokens_details": {"cached_tokens": 40},
        "completion_tokens_details": {"reasoning_tokens": 9},
    }
    fake.script(
        [
            {
                "kind": "valid",
                "content": ANSWER,
                "tokens_in": 120,
                "tokens_out": 60,
                "usage_extra": details,
                "echo_model": "deepseek-chat-0324",
                "headers": {"x-ratelimit-remaining-requests": "7"},
            }
        ]
    )
    progress = CallProgress()
    pieces: list[str] = []
    answer = await provider.generate(streamed(progress, on_delta=pieces.append))
    assert answer.content == TEXT
    assert "".join(pieces) == TEXT and len(pieces) == -(-len(TEXT) // 8)
    assert (answer.tokens_in, answer.tokens_out) == (120, 60)
    assert (answer.cached_input_tokens, answer.reasoning_tokens) == (40, 9)
    assert answer.model == "deepseek-chat-0324"
    assert answer.rate_limit is not None and answer.rate_limit.remaining_requests == 7
    assert progress.request_sent and progress.finished and progress.status == 200
    assert progress.usage == Usage(120, 60, 40, 9)
    assert progress.chars_received == len(TEXT)
    assert progress.tokens_received_estimate >= len(TEXT) // 4
    assert charge_for(progress, 100, 4096, 0.2) == Charge(120, 60, "reported", 40, 9)
    seen = await fake.astreams()
    assert seen["stream"] == [True] and seen["include_usage"] == [True]
    assert seen["ends"] == ["complete"]


async def test_without_stream_the_request_is_unchanged(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    pieces: list[str] = []
    progress = CallProgress()
    fake.script([{"kind": "valid", "content": ANSWER}])
    answer = await provider.generate(make_request(progress=progress, on_delta=pieces.append))
    assert answer.content == TEXT and pieces == [TEXT]
    assert progress.finished and progress.usage == Usage(11, 7)
    assert (await fake.astreams())["stream"] == [False]


async def test_a_plain_json_answer_to_a_streamed_request_is_an_ordinary_answer(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script([{"kind": "valid", "content": ANSWER, "stream_json": True, "tokens_in": 5}])
    progress = CallProgress()
    answer = await provider.generate(streamed(progress))
    assert answer.content == TEXT and answer.tokens_in == 5 and answer.usage_reported
    assert progress.finished and progress.usage == Usage(5, 7)
    assert (await fake.astreams())["stream"] == [True]


async def test_a_model_that_does_not_stream_is_never_asked_to(fake: FakeOpenAIServer) -> None:
    assert parse_model_set(" Local-Model, ,other ") == frozenset({"local-model", "other"})
    prov = OpenAICompatibleProvider(fake.base_url, stream_disabled_models={"Local-Model"})
    try:
        assert not prov.streams("local-model") and prov.streams("deepseek-chat")
        await prov.generate(streamed(model="local-model"))
        await prov.generate(streamed(model="deepseek-chat"))
    finally:
        await prov.aclose()
    everything = OpenAICompatibleProvider(fake.base_url, stream_disabled_models={"*"})
    try:
        await everything.generate(streamed(model="deepseek-chat"))
    finally:
        await everything.aclose()
    seen = await fake.astreams()
    assert seen["stream"] == [False, True, False]
    assert seen["include_usage"] == [False, True, False]


async def test_reasoning_text_counts_as_received_but_is_not_content(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script([{"kind": "valid", "content": {"a": 1}, "reasoning": "x" * 400}])
    progress = CallProgress()
    answer = await provider.generate(streamed(progress))
    assert answer.content == '{"a": 1}'
    assert progress.chars_received == len(answer.content)
    assert progress.tokens_received_estimate >= 100


async def test_a_cancel_mid_stream_stops_reading_and_closes_the_connection(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script([{"kind": "valid", "content": ANSWER, "chunk_delay_s": 0.05}])
    progress = CallProgress()
    pieces: list[str] = []
    task = asyncio.create_task(provider.generate(streamed(progress, on_delta=pieces.append)))
    await _until(lambda: progress.chars_received >= 24)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    read = progress.chars_received
    assert progress.request_sent and not progress.finished and progress.usage is None
    assert 24 <= read < len(TEXT) and "".join(pieces) == TEXT[:read]
    charge = charge_for(progress, 100, 4096, 0.2)
    assert charge is not None and charge.basis == "estimated"
    assert charge.tokens_in == 120 and 0 < charge.tokens_out < 4096

    async def server_saw_the_client_go() -> bool:
        ends: list[str] = (await fake.astreams())["ends"]
        return ends == ["client_gone"]

    await eventually(server_saw_the_client_go, what="the server to see the client go")
    await asyncio.sleep(0.2)
    assert progress.chars_received == read  # nothing read after the cancel


@pytest.mark.parametrize("cut", ["close", "abort"])
async def test_a_stream_cut_after_two_pieces_fails_and_says_what_was_read(
    cut: str, fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script([{"kind": "valid", "content": ANSWER, "cut_after": 2, "cut": cut}])
    progress = CallProgress()
    with pytest.raises(ExecutionFailure) as info:
        await provider.generate(streamed(progress))
    assert_no_secrets(info.value)
    assert info.value.code == "PROVIDER_UNAVAILABLE"
    assert progress.request_sent and not progress.finished and progress.usage is None
    assert progress.chars_received == 16
    assert charge_for(progress, 100, 4096, 0.0) == Charge(100, 4, "estimated")


async def test_a_timeout_mid_stream_keeps_what_was_read(fake: FakeOpenAIServer) -> None:
    fake.script([{"kind": "valid", "content": ANSWER, "chunk_delay_s": 0.1}])
    prov = OpenAICompatibleProvider(fake.base_url, timeout_s=0.5)
    progress = CallProgress()
    try:
        with pytest.raises(ExecutionFailure) as info:
            await prov.generate(streamed(progress))
    finally:
        await prov.aclose()
    assert info.value.code == "PROVIDER_TIMEOUT"
    assert progress.request_sent and not progress.finished
    assert 0 < progress.chars_received < len(TEXT)


async def test_an_error_answer_to_a_streamed_request_is_read_as_before(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script([{"kind": "rate_limited", "retry_after": "3"}])
    progress = CallProgress()
    with pytest.raises(ExecutionFailure) as info:
        await provider.generate(streamed(progress))
    assert info.value.code == "PROVIDER_RATE_LIMITED" and info.value.retry_after_float == 3.0
    assert progress.finished and progress.status == 429
    assert charge_for(progress, 100, 4096, 0.2) == Charge(0, 0, "reported")


async def test_a_cancel_before_any_answer_is_charged_the_worst_case(
    fake: FakeOpenAIServer, provider: OpenAICompatibleProvider
) -> None:
    fake.script([{"kind": "slow", "delay_s": 5}])
    progress = CallProgress()
    task = asyncio.create_task(provider.generate(streamed(progress)))
    await _until(lambda: progress.request_sent)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert progress.status is None and not progress.finished
    assert charge_for(progress, 100, 4096, 0.2) == Charge(120, 4096, "estimated")


async def test_a_refused_connection_sent_nothing() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    prov = OpenAICompatibleProvider(f"http://127.0.0.1:{port}/v1")
    progress = CallProgress()
    try:
        with pytest.raises(ExecutionFailure) as info:
            await prov.generate(streamed(progress))
    finally:
        await prov.aclose()
    assert info.value.code == "PROVIDER_UNAVAILABLE"
    assert not progress.request_sent
    assert charge_for(progress, 100, 4096, 0.2) is None


# --- event-stream edges, through a mock transport ----------------------------------------


def _sse(body: str) -> httpx.MockTransport:
    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, content=body.encode(), headers={"content-type": "text/event-stream"}
        )

    return httpx.MockTransport(handler)


def _data(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
    chunk = {"choices": [{"delta": delta, "finish_reason": finish}], **extra}
    return f"data: {json.dumps(chunk)}\n\n"


async def _stream_of(body: str, progress: CallProgress | None = None) -> str:
    async with httpx.AsyncClient(transport=_sse(body)) as client:
        prov = OpenAICompatibleProvider("http://provider.test", client=client)
        return (await prov.generate(streamed(progress))).content


async def test_comments_and_other_fields_are_skipped_and_a_finish_ends_the_answer() -> None:
    body = (
        ": keep-alive\n\nevent: message\nid: 1\n"
        + _data({"content": '{"a"'})
        + _data({"content": ": 1}"}, "stop", model="m")
    )
    assert await _stream_of(body) == '{"a": 1}'


async def test_a_content_filter_finish_is_a_safety_block() -> None:
    with pytest.raises(ExecutionFailure) as info:
        await _stream_of(_data({"content": "x"}) + _data({}, "content_filter") + "data: [DONE]\n\n")
    assert info.value.code == "CONTENT_SAFETY_BLOCKED"


@pytest.mark.parametrize(
    "body",
    [
        "data: not json\n\n",
        'data: {"error": {"message": "overloaded"}}\n\n',
        _data({"content": "{"}),  # ends with neither a finish nor [DONE]
    ],
)
async def test_a_broken_stream_is_a_retryable_provider_failure(body: str) -> None:
    progress = CallProgress()
    with pytest.raises(ExecutionFailure) as info:
        await _stream_of(body, progress)
    assert info.value.code == "PROVIDER_UNAVAILABLE"
    assert info.value.__context__ is None and info.value.__cause__ is None
    assert not progress.finished
    # A mock transport does not trace: a call that did not end normally counts as sent.
    assert progress.request_sent


async def test_a_stream_without_usage_is_charged_from_what_was_read() -> None:
    progress = CallProgress()
    body = _data({"content": '{"a": 1}'}, "stop") + "data: [DONE]\n\n"
    async with httpx.AsyncClient(transport=_sse(body)) as client:
        prov = OpenAICompatibleProvider("http://provider.test", client=client)
        answer = await prov.generate(streamed(progress))
    assert answer.content == '{"a": 1}' and not answer.usage_reported
    assert (answer.tokens_in, answer.tokens_out) == (0, 0)
    assert progress.finished and progress.usage is None
    assert charge_for(progress, 100, 4096, 0.5) == Charge(150, 3, "estimated")
