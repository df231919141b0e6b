"""A job that reuses another job's answer (`ResolveResult.reuses`), in its workflow: the `reuse`
stage instead of EXECUTE. Its answer copied: the run goes on to PROJECT as if EXECUTE had
stored it (no call). Its source still queued or running: the run waits for the
`reuse-source-ended` signal (the reuse waker sends it when the source ends,
runtime/reuse_waker.py), at most REUSE_WAIT_BACKSTOP_S, then asks the stage again; no slot is
held and nothing is polled per job. Its source ended without an answer: None, and the run makes
its own call through EXECUTE.

`ends` counts the signals the run received; a wait compares with the count taken before the
stage ran, so a signal that arrived while the stage ran is not lost."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from temporalio import workflow

from workflows import stages
from workflows.limit_wait import Wakes

with workflow.unsafe.imports_passed_through():
    from engine.contracts import (
        ExecuteResult,
        JobWorkflowInput,
        ResolveResult,
        ReuseInput,
        ReuseResult,
    )
    from engine.tiers import REUSE_WAIT_BACKSTOP_S


async def _source_end(ends: Wakes, seen: int, timeout_s: float) -> None:
    """Until a signal newer than `seen`, or `timeout_s` (then the stage looks again)."""
    try:
        await workflow.wait_condition(lambda: ends.count > seen, timeout=timeout_s)
    except TimeoutError:  # asyncio.TimeoutError: the backstop
        pass


Stage = Callable[[ReuseInput], Awaitable[ReuseResult]]


async def reused(
    inp: JobWorkflowInput,
    resolved: ResolveResult,
    ends: Wakes,
    local: Callable[[Stage, ReuseInput], Awaitable[ReuseResult]],
) -> ExecuteResult | None:
    """The job's answer from its source (`ExecuteResult` with its hash, or with the state the
    job ended in before), or None: it makes its own call (RESOLVE said it reuses nothing, or
    its source ended without an answer). `local` runs a stage as the workflow's other local
    activities run (its timeout and retries). A long wait continues as new when the server
    suggests it, as a gate wait does."""
    if not resolved.reuses:
        return None
    while True:
        seen = ends.count
        found = await local(stages.reuse, ReuseInput(job_id=inp.jobId))
        if found.action == "copied":
            return ExecuteResult(output_hash=found.output_hash, attempt=0)
        if found.action == "ended":
            return ExecuteResult(output_hash="", attempt=0, lifecycle_status=found.lifecycle_status)
        if found.action != "wait":
            return None
        await _source_end(ends, seen, found.look_again_s or REUSE_WAIT_BACKSTOP_S)
        if workflow.info().is_continue_as_new_suggested():
            workflow.continue_as_new(
                JobWorkflowInput(
                    jobId=inp.jobId,
                    jobType=inp.jobType,
                    idempotencyKey=inp.idempotencyKey,
                    createdAt=inp.createdAt,
                    attemptsSpent=inp.attemptsSpent,
                )
            )
