"""How the job workflow reads a failure: its public code, whether it was a cancellation, and the
signal that a chunk's gate waits filled the run's history. Pure: no workflow commands."""

from __future__ import annotations

import asyncio

from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    TimeoutError,
    TimeoutType,
)


def error_code(err: BaseException) -> str:
    """The public error code behind an activity failure."""
    cause: BaseException | None = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError) and cause.type:
        return cause.type
    if isinstance(cause, TimeoutError):
        if cause.type == TimeoutType.HEARTBEAT:
            return "INTERNAL_WORKER_LOST"
        return "TIMEOUT"
    return "INTERNAL_ERROR"


class HistoryFull(Exception):
    """A chunk waited on its gate until the server suggested a continue-as-new (the run's
    history grew long): the fan-out lets the chunks in flight end, then continues as new (a
    new run resumes from what SQL says is done, each chunk with the attempts it spent)."""


def is_cancellation(err: BaseException) -> bool:
    if isinstance(err, asyncio.CancelledError | CancelledError):
        return True
    if isinstance(err, ActivityError):
        if isinstance(err.cause, CancelledError):
            return True
        if isinstance(err.cause, ApplicationError) and err.cause.type == "CANCELLED":
            return True
    return False
