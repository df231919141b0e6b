"""Provider failures through the real engine, against the fake
OpenAI-compatible server: each failure ends in the documented code, retried or not as documented.

"Not retried" is made observable: the fake server's default answer is a VALID output, so a
retry that should not happen would turn the job into a success and a second call.
Test-only variants of quiz_generation give short timeouts and chosen backoffs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
from temporalio.client import Client

from db.session import SessionMaker
from jobs.spec import Catalog
from jobs.types import quiz_generation as quiz
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import fake_env, usage_rows, user_prompts
from tests.stack import JOB_QUEUES, Stack, catalog_with, engine_stack, make_settings, variant

QUIZ_FAST = variant(quiz.JOB, "test_quiz_fast", timeout_ms=5000, max_retries=1, backoff_ms=1000)
# A long backoff: a retry after ~1 s can only come from honouring Retry-After.
QUIZ_SLOW_BACKOFF = variant(
    quiz.JOB, "test_quiz_slow_backoff", timeout_ms=5000, max_retries=1, backoff_ms=10_000
)
QUIZ_SHORT_TIMEOUT = variant(
    quiz.JOB, "test_quiz_short_timeout", timeout_ms=1000, max_retries=0, backoff_ms=1000
)
CATALOG: Catalog = catalog_with(QUIZ_FAST, QUIZ_SLOW_BACKOFF, QUIZ_SHORT_TIMEOUT)

SOURCE = "Mitochondria produce most of the cell's ATP. Ribosomes assemble proteins."
INPUT = {"sourceText": SOURCE, "count": 1}
VALID = {
    "questions": [
        {
            "question": "What do ribosomes do?",
            "choices": ["Assemble proteins", "Produce ATP", "Store DNA", "Digest waste"],
            "answer_index": 0,
            "explanation": "The text says ribosomes assemble proteins.",
        }
    ]
}
VALID_STEP = {"kind": "valid", "content": VALID}


@pytest.fixture
async def stack_for(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> Any:
    """`async with stack_for(**env) as stack`: an engine pointed at the (reset) fake server;
    `blocklist`: its content safety rules."""

    def make(blocklist: Sequence[str] = (), **env: Any) -> Any:
        settings = make_settings(database_url, temporal_address, **fake_env(fake, **env))
        return engine_stack(
            settings, temporal_client, catalog=CATALOG, queues=JOB_QUEUES, blocklist=blocklist
        )

    return make


async def _run(
    stack: Stack,
    fake: FakeOpenAIServer,
    steps: list[dict[str, Any]],
    job_type: str,
    *,
    default: dict[str, Any] | None = VALID_STEP,
    timeout: float = 30,
) -> Any:
    await fake.ascript(steps, default=default)
    job_id = await stack.create(job_type=job_type, input=INPUT)
    return await stack.wait_status(job_id, "succeeded", "failed", timeout=timeout)


async def test_401_is_credential_invalid_and_fails_at_once(
    stack_for: Any, fake: FakeOpenAIServer
) -> None:
    async with stack_for() as stack:
        row = await _run(
            stack, fake, [{"kind": "status", "status": 401, "message": "bad key"}], "test_quiz_fast"
        )
        assert (row.lifecycle_status, row.error_code) == ("failed", "CREDENTIAL_INVALID")
        assert row.public_error_message == "The AI provider rejected the credential."
        assert (await fake.acalls())["count"] == 1
        assert row.attempt_count == 1
        assert [u.error_code for u in await usage_rows(stack, row.id)] == ["CREDENTIAL_INVALID"]


async def test_429_honours_retry_after_then_succeeds(
    stack_for: Any, fake: FakeOpenAIServer
) -> None:
    async with stack_for() as stack:
        started = time.monotonic()
        row = await _run(
            stack, fake, [{"kind": "rate_limited", "retry_after": "1"}], "test_quiz_slow_backoff"
        )
        elapsed = time.monotonic() - started
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert (await fake.acalls())["count"] == 2
        usage = await usage_rows(stack, row.id)
        assert [u.error_code for u in usage] == ["PROVIDER_RATE_LIMITED", None]
        # The definition's backoff is 10 s; Retry-After said 1 s.
        assert elapsed < 8, f"retry took {elapsed:.1f}s: Retry-After was not honoured"


async def test_500_is_retried_then_succeeds(stack_for: Any, fake: FakeOpenAIServer) -> None:
    async with stack_for() as stack:
        row = await _run(stack, fake, [{"kind": "status", "status": 500}], "test_quiz_fast")
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert row.output == VALID
        assert (await fake.acalls())["count"] == 2
        usage = await usage_rows(stack, row.id)
        assert [(u.attempt_no, u.error_code) for u in usage] == [
            (1, "PROVIDER_UNAVAILABLE"),
            (2, None),
        ]


async def test_500_until_retries_run_out_fails_provider_unavailable(
    stack_for: Any, fake: FakeOpenAIServer
) -> None:
    async with stack_for() as stack:
        row = await _run(
            stack, fake, [], "test_quiz_fast", default={"kind": "status", "status": 503}
        )
        assert (row.lifecycle_status, row.error_code) == ("failed", "PROVIDER_UNAVAILABLE")
        assert (await fake.acalls())["count"] == 2  # max_retries=1: two attempts, no more
        assert row.attempt_count == 2
        assert "503" in (row.internal_error_message or "")


async def test_slow_provider_beyond_timeout_fails_with_timeout(
    stack_for: Any, fake: FakeOpenAIServer
) -> None:
    async with stack_for() as stack:
        started = time.monotonic()
        row = await _run(
            stack,
            fake,
            [{"kind": "slow", "delay_s": 30, "content": VALID}],
            "test_quiz_short_timeout",
        )
        assert row.lifecycle_status == "failed"
        assert row.error_code in ("TIMEOUT", "PROVIDER_TIMEOUT")
        assert time.monotonic() - started < 15, "the 1 s timeout did not stop the call"
        assert (await fake.acalls())["count"] == 1
        usage = await usage_rows(stack, row.id)
        assert [u.error_code for u in usage] == [row.error_code]
        assert 900 <= usage[0].latency_ms < 10_000


async def test_invalid_json_is_retried_with_a_corrective_instruction(
    stack_for: Any, fake: FakeOpenAIServer
) -> None:
    async with stack_for() as stack:
        row = await _run(stack, fake, [{"kind": "invalid_json"}], "test_quiz_fast")
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        calls = await fake.acalls()
        assert calls["count"] == 2
        first, second = await user_prompts(fake)
        assert "Correction" not in first
        assert second.startswith(first)
        assert "Correction: Your previous answer was rejected: output is not valid JSON" in second
        usage = await usage_rows(stack, row.id)
        assert [u.error_code for u in usage] == ["VALIDATION_OUTPUT_INVALID", None]


async def test_schema_invalid_output_is_corrected_then_fails_validation(
    stack_for: Any, fake: FakeOpenAIServer
) -> None:
    async with stack_for() as stack:
        row = await _run(stack, fake, [], "test_quiz_fast", default={"kind": "schema_invalid"})
        assert (row.lifecycle_status, row.error_code) == ("failed", "VALIDATION_OUTPUT_INVALID")
        assert row.public_error_message == "The AI provider returned an invalid result."
        calls = await fake.acalls()
        assert calls["count"] == 2
        first, second = await user_prompts(fake)
        assert "Correction" not in first
        # The correction names what was wrong: `questions` missing, `unexpected` not allowed.
        correction = second[len(first) :]
        assert "Your previous answer was rejected" in correction
        assert "questions" in correction and "unexpected" in correction
        assert "matches the schema exactly" in correction


async def test_provider_content_filter_is_blocked_and_not_retried(
    stack_for: Any, fake: FakeOpenAIServer
) -> None:
    async with stack_for() as stack:
        row = await _run(stack, fake, [{"kind": "content_filter"}], "test_quiz_fast")
        assert (row.lifecycle_status, row.error_code) == ("failed", "CONTENT_SAFETY_BLOCKED")
        assert (await fake.acalls())["count"] == 1
        assert row.attempt_count == 1


async def test_blocklist_hit_blocks_before_any_provider_call(
    stack_for: Any, fake: FakeOpenAIServer
) -> None:
    async with stack_for(blocklist=["nerve agent", "forbidden topic"]) as stack:
        await fake.ascript([], default=VALID_STEP)
        blocked = await stack.create(
            job_type="test_quiz_fast",
            input={"sourceText": "How to make a Forbidden   Topic at home.", "count": 1},
        )
        row = await stack.wait_status(blocked, "succeeded", "failed", timeout=30)
        assert (row.lifecycle_status, row.error_code) == ("failed", "CONTENT_SAFETY_BLOCKED")
        assert row.attempt_count == 1
        assert (await fake.acalls())["count"] == 0
        usage = await usage_rows(stack, blocked)
        assert [(u.error_code, u.tokens_in, u.cost_usd) for u in usage] == [
            ("CONTENT_SAFETY_BLOCKED", 0, 0)
        ]
        assert "forbidden" not in (row.internal_error_message or "").lower()

        # The same engine still serves clean input (the rules match whole words only).
        clean = await stack.create(
            job_type="test_quiz_fast",
            input={"sourceText": "Forbidden topics are fine.", "count": 1},
        )
        row = await stack.wait_status(clean, "succeeded", "failed", timeout=30)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert (await fake.acalls())["count"] == 1
