"""The bound on the bookkeeping stages without a server (activities/bounded.py): an unexpected
error is retried until its last attempt, then becomes a non-retryable INTERNAL_ERROR with the
code's public message; outages, cancels, Temporal's errors and the stage's own ApplicationError
pass through unchanged on every attempt; EXECUTE is never touched. The engine end to end is
tests/integration/test_bounded_stages.py."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import psycopg
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput

from activities.bounded import BoundedStagesInterceptor
from engine.contracts import EXECUTE, PREPARE, PROJECT, StageInput
from engine.errors import public_message_for

SECRET = "private-detail-of-the-fault"


class _Raises(ActivityInboundInterceptor):
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        raise self.exc


async def _run(exc: BaseException, *, stage: str, attempt: int) -> BaseException:
    inbound = BoundedStagesInterceptor(None, attempts=3).intercept_activity(_Raises(exc))
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, activity_type=stage, attempt=attempt)
    inp = ExecuteActivityInput(
        fn=lambda: None, args=[StageInput("j", "w")], executor=None, headers={}
    )

    async def body() -> None:
        await inbound.execute_activity(inp)

    with pytest.raises(BaseException) as caught:
        await env.run(body)
    return caught.value


async def test_an_unexpected_error_is_retried_then_ends_the_job_internal_error() -> None:
    for attempt in (1, 2):
        err = RuntimeError(SECRET)
        assert await _run(err, stage=PREPARE, attempt=attempt) is err
    final = await _run(RuntimeError(SECRET), stage=PROJECT, attempt=3)
    assert isinstance(final, ApplicationError)
    assert (final.type, final.non_retryable) == ("INTERNAL_ERROR", True)
    assert final.message == public_message_for("INTERNAL_ERROR")
    assert SECRET not in str(final) and final.__cause__ is None and final.__suppress_context__


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.OperationalError("connection refused"),
        ConnectionResetError(),
        TimeoutError(),
        RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b""),
        ApplicationError("ours", type="INTERNAL_PROJECTION_FAILED"),
        asyncio.CancelledError(),
    ],
)
async def test_outages_cancels_and_named_failures_pass_through_on_every_attempt(
    exc: BaseException,
) -> None:
    assert await _run(exc, stage=PREPARE, attempt=50) is exc


async def test_execute_is_not_bounded_here() -> None:
    err = RuntimeError(SECRET)
    assert await _run(err, stage=EXECUTE, attempt=50) is err


def test_a_stage_has_at_least_one_attempt() -> None:
    with pytest.raises(ValueError):
        BoundedStagesInterceptor(None, attempts=0)
