"""What Temporal may learn of an activity's failure: a code and a public message, never an
exception's own text.

A driver error's message carries hosts, ports, SQL and `DETAIL: Failing row contains (...)` with
job data in it; Temporal stores failure messages in its history, for every operator and every
history export to read. This interceptor turns any exception that is not already an
`ApplicationError` (our own failures carry public messages) into one with a code from the error
taxonomy and its public message. The original goes to this worker's log, as its type only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from db.errors import is_unavailable
from engine.errors import public_message_for

log = logging.getLogger(__name__)

DATABASE_UNAVAILABLE = "INTERNAL_DATABASE_UNAVAILABLE"
INTERNAL_ERROR = "INTERNAL_ERROR"


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
            )
            raise public_failure(exc) from None


class PublicFailureInterceptor(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)
