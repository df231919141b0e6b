"""A long source's fan-out in the job workflow: one EXECUTE per chunk, each through its own
gate loop (`JobStages._execute_through_gate`, passed in), then MERGE (docs/architecture.md,
"Long sources: the fan-out"). Deterministic like the rest of the workflow: only job ids,
chunk numbers and counts reach the history."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from temporalio import workflow

from workflows import stages
from workflows.failures import HistoryFull

with workflow.unsafe.imports_passed_through():
    from engine.contracts import (
        ExecuteResult,
        ExecutionPlan,
        JobWorkflowInput,
        MergeInput,
        ResolveResult,
    )


class ThroughGate(Protocol):
    def __call__(
        self,
        inp: JobWorkflowInput,
        plan: ExecutionPlan,
        *,
        chunk_no: int | None = None,
        spent: int | None = None,
    ) -> Awaitable[ExecuteResult]: ...


Local = Callable[[Any, Any], Awaitable[Any]]


async def execute_chunks(
    through_gate: ThroughGate,
    local: Local,
    inp: JobWorkflowInput,
    plan: ExecutionPlan,
    resolved: ResolveResult,
) -> ExecuteResult:
    """A long source's chunks, each one EXECUTE through its own gate loop with its own
    retry policy (its attempts are its own), at most `chunk_concurrency` in flight; chunks
    already succeeded are skipped. Then MERGE stores the job's output. A chunk that fails
    for good cancels the others in flight (each records its aborted call) and fails the
    job with its own code. Only the job id, chunk numbers and counts reach the history."""
    done = set(resolved.chunks_done)
    todo = iter(n for n in range(resolved.chunk_count) if n not in done)
    window = max(resolved.chunk_concurrency, 1)
    spent = resolved.chunk_attempts
    running: list[asyncio.Task[ExecuteResult]] = []
    ended: ExecuteResult | None = None
    history_full = False
    nxt = next(todo, None)
    try:
        while True:
            while nxt is not None and len(running) < window and not history_full and not ended:
                offset = spent[nxt] if nxt < len(spent) else 0
                running.append(
                    asyncio.ensure_future(through_gate(inp, plan, chunk_no=nxt, spent=offset))
                )
                nxt = next(todo, None)
            if not running:
                break
            # workflow.wait, not asyncio.wait: its result is the same on every replay.
            finished, _ = await workflow.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in [t for t in running if t in finished]:  # in the order they began
                running.remove(task)
                try:
                    result = task.result()
                except HistoryFull:
                    history_full = True
                    continue
                if result.lifecycle_status is not None:
                    ended = result  # the job ended before it ran (cancelled while queued)
    except BaseException:
        for task in running:
            task.cancel()
        if running:
            await workflow.wait(running)  # each aborted call is recorded before the end
        raise
    if ended is not None:
        return ended
    if history_full:
        workflow.continue_as_new(
            JobWorkflowInput(
                jobId=inp.jobId,
                jobType=inp.jobType,
                idempotencyKey=inp.idempotencyKey,
                createdAt=inp.createdAt,
            )
        )
    merged = await local(stages.merge, MergeInput(job_id=inp.jobId))
    return ExecuteResult(output_hash=merged.output_hash, attempt=0)
