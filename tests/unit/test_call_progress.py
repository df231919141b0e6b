"""What a provider call is charged whatever way it ended (providers.base.charge_for), and how
the providers keep a call's CallProgress: no database, no Temporal."""

from __future__ import annotations

import asyncio

import pytest

from engine.errors import ExecutionFailure
from providers.base import (
    CallProgress,
    Charge,
    ProviderRequest,
    SyntheticBehaviour,
    Usage,
    charge_for,
)
from providers.synthetic import SyntheticProvider

PROMPT = 1000
BUDGET = 4096
MARGIN = 0.2


def test_nothing_sent_is_nothing_to_charge() -> None:
    assert charge_for(CallProgress(), PROMPT, BUDGET, MARGIN) is None


def test_reported_usage_wins_whatever_else_was_read() -> None:
    progress = CallProgress(
        request_sent=True,
        status=200,
        usage=Usage(900, 300, cached_input_tokens=500, reasoning_tokens=100),
        chars_received=5000,
        tokens_received_estimate=1250,
    )
    assert charge_for(progress, PROMPT, BUDGET, MARGIN) == Charge(900, 300, "reported", 500, 100)


def test_an_error_answer_read_whole_is_what_the_provider_said() -> None:
    for status in (429, 500, 503, 400):
        progress = CallProgress(request_sent=True, status=status, finished=True)
        assert charge_for(progress, PROMPT, BUDGET, MARGIN) == Charge(0, 0, "reported")


def test_an_error_answer_cut_before_its_end_is_the_worst_case() -> None:
    progress = CallProgress(request_sent=True, status=500, finished=False)
    assert charge_for(progress, PROMPT, BUDGET, MARGIN) == Charge(1200, BUDGET, "estimated")


def test_part_of_a_stream_read_is_prompt_plus_received_with_the_margin() -> None:
    progress = CallProgress(
        request_sent=True, status=200, chars_received=400, tokens_received_estimate=100
    )
    assert charge_for(progress, PROMPT, BUDGET, MARGIN) == Charge(1200, 120, "estimated")
    # Never more answer than its budget.
    progress.tokens_received_estimate = 4000
    assert charge_for(progress, PROMPT, BUDGET, MARGIN) == Charge(1200, BUDGET, "estimated")


def test_nothing_of_the_answer_read_is_the_worst_case() -> None:
    for progress in (
        CallProgress(request_sent=True),
        CallProgress(request_sent=True, status=200),
        # A whole 200 with no usage and nothing in it (an empty answer): the worst case.
        CallProgress(request_sent=True, status=200, finished=True),
    ):
        assert charge_for(progress, PROMPT, BUDGET, MARGIN) == Charge(1200, BUDGET, "estimated")
    assert charge_for(CallProgress(request_sent=True), 0, 0, 0.0) == Charge(0, 0, "estimated")


def test_a_charge_unpacks_as_tokens_in_out_and_basis() -> None:
    tokens_in, tokens_out, basis, cached, reasoning = Charge(1, 2, "estimated")
    assert (tokens_in, tokens_out, basis, cached, reasoning) == (1, 2, "estimated", 0, 0)


def _request(**fields: object) -> ProviderRequest:
    base: dict[str, object] = {
        "job_id": "j",
        "job_type": "synthetic",
        "attempt": 1,
        "model": "synthetic",
        "system_prompt": "s",
        "user_prompt": "u",
        "output_schema": {},
        "timeout_s": 5.0,
    }
    base.update(fields)
    return ProviderRequest(**base)  # type: ignore[arg-type]


async def test_synthetic_keeps_the_progress() -> None:
    progress = CallProgress()
    pieces: list[str] = []
    behaviour = SyntheticBehaviour(output={"a": 1})
    answer = await SyntheticProvider().generate(
        _request(synthetic=behaviour, progress=progress, on_delta=pieces.append)
    )
    assert progress.request_sent and progress.finished and progress.status == 200
    assert progress.usage == Usage(answer.tokens_in, answer.tokens_out)
    assert "".join(pieces) == answer.content
    assert charge_for(progress, 1, 1, 0.0) == Charge(
        answer.tokens_in, answer.tokens_out, "reported"
    )


async def test_synthetic_cancelled_mid_call_is_sent_and_unread() -> None:
    progress = CallProgress()
    task = asyncio.create_task(
        SyntheticProvider().generate(
            _request(synthetic=SyntheticBehaviour(output={}, hang=True), progress=progress)
        )
    )
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert progress.request_sent and not progress.finished
    assert charge_for(progress, 10, 20, 0.5) == Charge(15, 20, "estimated")


async def test_synthetic_scripted_failure_is_an_error_answer() -> None:
    progress = CallProgress()
    behaviour = SyntheticBehaviour(output={}, fail_times=1)
    with pytest.raises(ExecutionFailure):
        await SyntheticProvider().generate(_request(synthetic=behaviour, progress=progress))
    assert charge_for(progress, 10, 20, 0.5) == Charge(0, 0, "reported")
