"""The batch tier's pure parts on the job side: a batch line's body is the body a call sends
without `stream`; an output line's chat completion reads like a call's answer; which failed
batch attempts are tried again; the signal count a wait compares with; RESOLVE's tier decoding
from results recorded before it existed."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.converter import DataConverter

from engine.contracts import ExecutionPlan, ResolveResult
from engine.errors import ExecutionFailure
from providers.base import ProviderRequest
from providers.openai_compat import chat_answer, chat_body
from workflows.batch_tier import BatchResults, retry_follows


def _request(max_tokens: int | None = 900) -> ProviderRequest:
    return ProviderRequest(
        job_id="j",
        job_type="flashcard_generation",
        attempt=1,
        model="gpt-4o-mini",
        system_prompt="instructions",
        user_prompt="source",
        output_schema={},
        timeout_s=30.0,
        max_tokens=max_tokens,
        stream=True,
    )


def test_a_batch_line_body_is_the_call_body_without_stream() -> None:
    call = chat_body(_request(), stream=True)
    line = chat_body(_request(), stream=None)
    assert call.pop("stream") is True and call.pop("stream_options") == {"include_usage": True}
    assert line == call
    assert list(line) == ["model", "messages", "response_format", "max_tokens"]
    assert line["response_format"] == {"type": "json_object"}
    assert line["messages"] == [
        {"role": "system", "content": "instructions"},
        {"role": "user", "content": "source"},
    ]
    assert "max_tokens" not in chat_body(_request(None), stream=None)
    assert chat_body(_request(), stream=False)["stream"] is False  # as a call sends it


def _completion(**choice: Any) -> dict[str, Any]:
    return {"id": "c1", "model": "gpt-4o-mini", "choices": [choice]}


def test_an_output_lines_completion_reads_like_a_calls_answer() -> None:
    body = _completion(message={"role": "assistant", "content": '{"a": 1}'}, finish_reason="stop")
    assert chat_answer(body) == '{"a": 1}'
    with pytest.raises(ExecutionFailure) as filtered:
        chat_answer(_completion(message={"content": ""}, finish_reason="content_filter"))
    assert filtered.value.code == "CONTENT_SAFETY_BLOCKED"
    bodies: list[Any] = [None, {}, {"choices": []}, _completion(message="x"), _completion()]
    for bad in bodies:
        with pytest.raises(ExecutionFailure) as malformed:
            chat_answer(bad)
        assert malformed.value.code == "PROVIDER_UNAVAILABLE"


PLAN = ExecutionPlan(
    timeout_ms=90_000,
    max_attempts=3,
    backoff_ms=1000,
    abort_strategy="retry",
    heartbeat_timeout_ms=30_000,
)


@pytest.mark.parametrize(
    ("code", "attempt", "again"),
    [
        ("PROVIDER_UNAVAILABLE", 1, True),  # a failed line: the next batch
        ("VALIDATION_OUTPUT_INVALID", 2, True),  # an invalid answer: again, corrected
        ("PROVIDER_UNAVAILABLE", 3, False),  # no attempt left
        ("REQUEST_REJECTED", 1, False),  # no retry changes the request
        ("CONTENT_SAFETY_BLOCKED", 1, False),
        ("INTERNAL_ERROR", 1, True),  # once
        ("INTERNAL_ERROR", 2, False),
    ],
)
def test_which_failed_batch_attempts_go_to_the_next_batch(
    code: str, attempt: int, again: bool
) -> None:
    assert retry_follows(code, attempt=attempt, plan=PLAN) is again


def test_signals_are_counted_so_one_during_the_enroll_is_not_lost() -> None:
    results = BatchResults()
    seen = results.count
    results.arrived()  # arrives while the enroll runs
    assert results.count > seen
    results.arrived()
    assert results.count == seen + 2


def test_resolve_results_recorded_before_the_tier_decode_as_standard() -> None:
    conv = DataConverter.default.payload_converter
    old = ResolveResult(
        prompt_version="v1", credential_mode="platform_key", provider="p", model="m"
    )
    payload = conv.to_payloads([old])[0]
    raw = payload.data.replace(b',"service_tier":"standard"', b"")
    assert b"service_tier" not in raw
    payload.data = raw
    decoded = conv.from_payloads([payload], [ResolveResult])[0]
    assert decoded.service_tier == "standard"
