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
import sqlalchemy.exc
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput

from activities.bounded import BoundedStagesInterceptor
from activities.heartbeat import STATEMENT_FAULT_TRIES, db_retry
from db.errors import is_statement_fault, is_unavailable
from engine.contracts import EXECUTE, FINALIZE_FAILED, PREPARE, PROJECT, StageInput
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


def _wrapped(orig: Exception) -> Exception:
    """A driver error as SQLAlchemy raises it."""
    return sqlalchemy.exc.OperationalError("SELECT 1", {}, orig)


STATEMENT_FAULTS = [
    psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
    psycopg.errors.LockNotAvailable("could not obtain lock"),
]


@pytest.mark.parametrize("orig", STATEMENT_FAULTS)
async def test_a_statement_timeout_or_a_lock_not_available_is_not_an_outage(
    orig: Exception,
) -> None:
    """The driver calls them OperationalError, as it does a lost connection; the database
    answered, though: they count toward the bound and end the job INTERNAL_ERROR."""
    for exc in (orig, _wrapped(orig)):
        assert is_statement_fault(exc) and not is_unavailable(exc)
        assert await _run(exc, stage=PREPARE, attempt=1) is exc  # retried
        final = await _run(exc, stage=FINALIZE_FAILED, attempt=3)
        assert isinstance(final, ApplicationError) and final.type == "INTERNAL_ERROR"
        assert final.non_retryable
    lost = _wrapped(psycopg.OperationalError("connection refused"))
    assert is_unavailable(lost) and not is_statement_fault(lost)


async def _db_retry(op: Any) -> tuple[BaseException | None, int]:
    tries = 0

    async def counted() -> str:
        nonlocal tries
        tries += 1
        return str(await op(tries))

    env = ActivityEnvironment()
    try:
        await env.run(db_retry, counted, budget_s=60.0, delay_s=0.01)
    except Exception as exc:
        return exc, tries
    return None, tries


@pytest.mark.parametrize("orig", STATEMENT_FAULTS)
async def test_execute_tries_a_stopped_statement_three_times_then_fails_the_attempt(
    orig: Exception,
) -> None:
    async def always(_: int) -> str:
        raise _wrapped(orig)

    err, tries = await _db_retry(always)
    assert tries == STATEMENT_FAULT_TRIES == 3
    assert err is not None and is_statement_fault(err)

    async def once(n: int) -> str:
        if n == 1:
            raise _wrapped(orig)
        return "ok"

    assert await _db_retry(once) == (None, 2)


async def test_execute_still_waits_out_an_outage() -> None:
    """Past STATEMENT_FAULT_TRIES: a lost connection is no statement fault."""

    async def down(n: int) -> str:
        if n <= STATEMENT_FAULT_TRIES:
            raise _wrapped(psycopg.OperationalError("connection refused"))
        return "ok"

    assert await _db_retry(down) == (None, STATEMENT_FAULT_TRIES + 1)
