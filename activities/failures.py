"""What an unexpected exception may tell whom.

- Temporal: a code and a public message, never an exception's own text. A driver error's
  message carries hosts, ports, SQL and `DETAIL: Failing row contains (...)` with job data in
  it; Temporal stores failure messages in its history, for every operator and every history
  export to read. The interceptor turns any exception that is not already an `ApplicationError`
  (our own failures carry public messages) into one with a code from the error taxonomy and its
  public message.
- The worker's log: the exception's type and its full traceback (file, line, function and
  source line of every frame), but not its message, which may quote job data.
- SUPER_ADMIN (`ai_job.internal_error_message`, built by `internal_message`): the type, the
  message (a driver error's as its SQLSTATE only; any message that quotes the job's input,
  output or key is withheld) and the engine's own frames as `file:line in function`, bounded.
  No locals, no arguments, no source lines.

How a job stage fails (the error taxonomy, `engine/errors.py`): an attempt that may be retried
raises `ApplicationError(type=CODE, non_retryable=False)` and Temporal's retry policy decides
(`fail_attempt`); a failure nothing a retry could change raises it non-retryable (`fail_final`,
`fail_domain`). The message is always the code's public message; details for operators go to
`ai_job.internal_error_message`.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from temporalio import activity
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from db.errors import is_driver_error, is_unavailable, sqlstate
from engine.errors import EngineError, ExecutionFailure, is_retryable, public_message_for

log = logging.getLogger(__name__)

DATABASE_UNAVAILABLE = "INTERNAL_DATABASE_UNAVAILABLE"
INTERNAL_ERROR = "INTERNAL_ERROR"


# The engine's own code: frames from files under these top-level packages of the project.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
OWN_PACKAGES = frozenset(
    {"activities", "api", "db", "engine", "jobs", "providers", "runtime", "workflows"}
)
STACK_MAX_FRAMES = 20  # the innermost ones: where it broke
INTERNAL_MESSAGE_MAX_CHARS = 4000
EXCEPTION_MESSAGE_MAX_CHARS = 500
# A message sharing this many consecutive characters with a private string quotes it.
QUOTE_WINDOW = 12
# A private string this short is only looked for whole (shorter ones are ordinary words).
QUOTE_MIN_WHOLE = 8
WITHHELD = "(message withheld: it quotes the job's data)"


def _is_own(filename: str) -> bool:
    try:
        rel = Path(filename).resolve().relative_to(PROJECT_ROOT)
    except (ValueError, OSError):
        return False
    return len(rel.parts) > 1 and rel.parts[0] in OWN_PACKAGES


def own_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The engine's own frames of `exc`'s traceback, innermost last, at most
    STACK_MAX_FRAMES. Library frames (SQLAlchemy, httpx, ...) are left out: they are the same
    for every failure and would push ours out of the bound."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_own(f.filename)]
    return frames[-STACK_MAX_FRAMES:]


def private_strings(*values: object) -> list[str]:
    """Every string inside JSON-like values (dict values, list items, plain strings): what a
    message must not quote. Dict keys are schema names, not data."""
    found: list[str] = []

    def walk(v: object, depth: int) -> None:
        if depth > 50:
            return
        if isinstance(v, str):
            found.append(v)
        elif isinstance(v, dict):
            for item in v.values():
                walk(item, depth + 1)
        elif isinstance(v, (list, tuple)):
            for item in v:
                walk(item, depth + 1)

    for value in values:
        walk(value, 0)
    return found


def _windows(s: str) -> Iterator[str]:
    for i in range(len(s) - QUOTE_WINDOW + 1):
        yield s[i : i + QUOTE_WINDOW]


def quotes_any(message: str, private: Iterable[str]) -> bool:
    """Does `message` contain a private string whole, or any QUOTE_WINDOW consecutive
    characters of one (a slice of a long input counts as a quote)?"""
    windows: set[str] = set()
    for p in private:
        if len(p) >= QUOTE_MIN_WHOLE and p in message:
            return True
        if len(p) >= QUOTE_WINDOW:
            windows.update(_windows(p))
    return any(w in windows for w in _windows(message))


def exception_message(exc: BaseException, private: Iterable[str] = ()) -> str:
    """`exc`'s own message as an admin may read it: a database driver's as its SQLSTATE only
    (its text repeats statement parameters, hence job data), any other's bounded and withheld
    when it quotes one of the `private` strings."""
    if is_driver_error(exc):
        state = sqlstate(exc)
        return f"SQLSTATE {state}" if state else "(driver message withheld)"
    message = str(exc)[:EXCEPTION_MESSAGE_MAX_CHARS]
    return WITHHELD if quotes_any(message, private) else message


def type_name(t: type[BaseException]) -> str:
    """`RuntimeError`, `sqlalchemy.exc.DataError`: builtins bare, the others with a module."""
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def internal_message(exc: BaseException, *, private: Iterable[str] = (), context: str = "") -> str:
    """The SUPER_ADMIN's view of an unexpected exception (`internalErrorMessage`): its type,
    its message (`exception_message`), the type of the exception it was raised from, and the
    engine's own frames as `file:line in function`, innermost last; at most
    INTERNAL_MESSAGE_MAX_CHARS. `context` says where (e.g. "projection failed")."""
    private = list(private)
    head = f"{type_name(type(exc))}: {exception_message(exc, private)}"
    lines = [f"{context}: {head}" if context else head]
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    if cause is not None:
        lines.append(f"raised from {type_name(type(cause))}")
    frames = own_frames(exc)
    if frames:
        lines.append("engine frames (innermost last):")
        for f in frames:
            rel = Path(f.filename).resolve().relative_to(PROJECT_ROOT)
            lines.append(f"  {rel.as_posix()}:{f.lineno} in {f.name}")
    text = "\n".join(lines)
    if len(text) > INTERNAL_MESSAGE_MAX_CHARS:
        text = text[: INTERNAL_MESSAGE_MAX_CHARS - 1] + "…"
    return text


def fail_attempt(
    code: str,
    *,
    attempt: int,
    abort_strategy: str = "retry",
    retry_after_s: float | None = None,
) -> NoReturn:
    """This attempt failed with `code`; the taxonomy says whether another may follow."""
    raise ApplicationError(
        public_message_for(code),
        type=code,
        non_retryable=not is_retryable(code, attempt=attempt, abort_strategy=abort_strategy),
        next_retry_delay=timedelta(seconds=retry_after_s) if retry_after_s else None,
    )


def fail_final(code: str) -> NoReturn:
    """A failure no retry can change (a missing job, a lost lock, a cancel)."""
    raise ApplicationError(public_message_for(code), type=code, non_retryable=True)


def fail_over_budget(job_id: str, limit: str, attempt: int) -> NoReturn:
    """Another call would exceed a cost limit (a budget, the job's cap): the job stops, final."""
    log.info(
        "another call would exceed a cost limit; the job stops",
        extra={"job_id": job_id, "limit": limit, "attempt": attempt},
    )
    fail_final("BUDGET_EXHAUSTED")


def fail_domain(exc: EngineError) -> NoReturn:
    """A domain error in a bookkeeping stage is final: retrying cannot change the answer."""
    raise ApplicationError(exc.public_message, type=exc.code, non_retryable=True) from None


class MessageWithheld(Exception):
    """Stands in for an exception in a log record: the original's traceback under its type's
    name, without its message (which may quote job data) and without its chained causes."""


def loggable(exc: BaseException) -> tuple[type[BaseException], BaseException, Any]:
    """`exc_info` for logging `exc`: its full traceback, its type and (for a driver error) its
    SQLSTATE, but never its message."""
    name = type_name(type(exc))
    state = sqlstate(exc) if is_driver_error(exc) else None
    stand_in = MessageWithheld(f"{name}" + (f" (SQLSTATE {state})" if state else ""))
    return MessageWithheld, stand_in, exc.__traceback__


def public_failure(exc: BaseException) -> ApplicationError:
    """The failure Temporal records for an unexpected exception: retryable (the stage's retry
    policy decides), with a code and its public message only."""
    code = DATABASE_UNAVAILABLE if is_unavailable(exc) else INTERNAL_ERROR
    return ApplicationError(public_message_for(code), type=code, non_retryable=False)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await self.next.execute_activity(input)
        except ApplicationError as exc:
            # Ours, with a public message; but an exception it was raised while handling would
            # travel along as its cause: cut the chain.
            exc.__cause__ = None
            exc.__suppress_context__ = True
            raise
        except (CancelledError, asyncio.CancelledError):
            raise
        except Exception as exc:
            info = activity.info()
            log.warning(
                "activity failed with an unexpected error",
                extra={
                    "activity": info.activity_type,
                    "workflow_id": info.workflow_id,
                    "attempt": info.attempt,
                    "error_type": type(exc).__name__,
                },
                exc_info=loggable(exc),
            )
            raise public_failure(exc) from None


class PublicFailureInterceptor(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)


def unexpected_failure(
    exc: Exception, job_id: str, attempt: int, private: list[str]
) -> ExecutionFailure:
    """A bug or an unexpected library error in EXECUTE: logged with its stack (the job's own
    strings withheld), and failed as INTERNAL_ERROR, which is retried once."""
    log.warning(
        "EXECUTE failed with an unexpected error",
        extra={"job_id": job_id, "attempt": attempt},
        exc_info=loggable(exc),
    )
    return ExecutionFailure(
        "INTERNAL_ERROR", internal_message=internal_message(exc, private=private)
    )
