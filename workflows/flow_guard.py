"""A job's start-by time and deadline in its workflow (engine/flow.py): durable timers, armed
only for a job that has one, so a plain job's run issues no command more.

The stages after PREPARE run as a task; one condition waits for that task with the timeout of
the next of the two times. When the start-by time comes first, `flow_expire` ends the job if it
was not admitted yet (then the task is cancelled: whatever it waited on, a provider limit, a
pause, an off-peak window, a slot, stops at once) and is forgotten if it was (a TTL no longer
applies once a job started). At the deadline, `flow_expire` ends a queued job or requests a
running one's cancel, and the task is cancelled as a cancel would: a call in flight is aborted
and charged, a long source keeps its succeeded chunks' items, and the job ends with the code the
cancel recorded (JOB_DEADLINE_EXCEEDED) in the workflow's finalizer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from typing import Any, TypeVar

from temporalio import workflow

from workflows import stages

with workflow.unsafe.imports_passed_through():
    from engine.contracts import FlowExpireInput, FlowExpireResult, PrepareResult
    from engine.flow import JOB_DEADLINE_EXCEEDED, JOB_EXPIRED

T = TypeVar("T")
Local = Callable[
    [Callable[[FlowExpireInput], Awaitable[FlowExpireResult]], FlowExpireInput],
    Awaitable[FlowExpireResult],
]


def _at(text: str) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


async def guarded(
    body: Coroutine[Any, Any, T], prep: PrepareResult, job_id: str, local: Local
) -> T:
    """`body` (the job's stages after PREPARE) under the job's start-by time and deadline."""
    task = asyncio.ensure_future(body)
    ttl, deadline = _at(prep.expires_at), _at(prep.deadline)
    try:
        while True:
            cut = min((t for t in (ttl, deadline) if t is not None), default=None)
            if cut is None:
                return await task
            wait_s = (cut - workflow.now()).total_seconds()
            if wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    await workflow.wait_condition(task.done, timeout=wait_s)
            if task.done():
                return task.result()
            if deadline is not None and deadline <= workflow.now():
                await local(stages.flow_expire, FlowExpireInput(job_id, JOB_DEADLINE_EXCEEDED))
                return await _stopped(task)
            if ttl is not None and ttl <= workflow.now():
                ttl = None  # looked at once: admitted, it no longer applies
                got = await local(stages.flow_expire, FlowExpireInput(job_id, JOB_EXPIRED))
                if got.ended:
                    return await _stopped(task)
    except asyncio.CancelledError:  # the workflow was cancelled: its stages stop with it
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        raise


async def _stopped(task: asyncio.Future[T]) -> T:
    """Cancel the stages; what they raise (a cancellation) goes to the run's finalizer."""
    task.cancel()
    return await task
