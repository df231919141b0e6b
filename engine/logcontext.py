"""Which job the code running now works on, for its log lines.

The activities (one job per activity run) and the API (one job per create) set it; the log
filter of the process (`runtime/logs.py`) copies it onto every record. Only ids live here: a job
id, its type and its workflow id, never anything the job carries. A context variable, so
concurrent jobs in one event loop never see each other's ids.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar, Token
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobLogContext:
    job_id: str
    job_type: str | None = None
    workflow_id: str | None = None


_CURRENT: ContextVar[JobLogContext | None] = ContextVar("aijobs_job", default=None)


def current_job() -> JobLogContext | None:
    return _CURRENT.get()


def bind_job(
    job_id: str, job_type: str | None = None, workflow_id: str | None = None
) -> Token[JobLogContext | None]:
    """Set for the rest of the current task (a request, an activity); `unbind` ends it early."""
    return _CURRENT.set(JobLogContext(job_id, job_type, workflow_id))


def unbind(token: Token[JobLogContext | None]) -> None:
    _CURRENT.reset(token)


@contextlib.contextmanager
def job_context(
    job_id: str, job_type: str | None = None, workflow_id: str | None = None
) -> Iterator[None]:
    token = bind_job(job_id, job_type, workflow_id)
    try:
        yield
    finally:
        _CURRENT.reset(token)
