"""EXECUTE's attempt over an answer held for moderation: no call, only the guardrails again.

An earlier attempt got a paid answer whose moderation could not run (`MODERATION_UNAVAILABLE`,
jobs/guardrails.py); it kept the answer (`held_answer`, its call charged as a success). This
attempt (its first transaction found it: jobs/attempt_start.py `Held`, no admission, no call)
moderates it again, restores and validates it, and stores the output as a call's settlement
would, without a usage row (db/attempts.py `settle` with no usage). A moderation that fails
again fails this attempt the same way (the answer stays held); an answer moderation blocks or
that does not validate fails it as a call's answer would, and lets the answer go.
"""

from __future__ import annotations

from typing import Protocol

from activities.deps import StageDeps, log
from activities.failures import fail_attempt, fail_final
from activities.heartbeat import db_retry, heartbeating
from db import attempts as attempts_db
from db import chunks as chunks_db
from db import held_answers as held_answers_db
from db import lifecycle as lifecycle_db
from db.attempts import Settlement
from engine.contracts import ExecuteInput, ExecuteResult
from engine.errors import ExecutionFailure
from engine.hashing import output_hash
from jobs import guardrails
from jobs.attempt_start import Held


class AttemptLike(Protocol):
    """What this needs of EXECUTE's attempt (activities/execute.py `_Attempt`)."""

    _d: StageDeps
    inp: ExecuteInput
    number: int
    owner: str
    chunk_no: int | None


async def moderate_again(attempt: AttemptLike, held: Held) -> ExecuteResult:
    """The held answer through moderate → restore → validate, then stored (module docstring)."""
    d, row = attempt._d, held.row
    _, masking = await guardrails.stored_input_off_loop(
        held.jt, held.snapshot["input"], d.gateway.guardrails.pii_region
    )
    guard = guardrails.Guard.of(d.gateway.guardrails, held.jt, masking)
    try:
        guarded = await guard.answer(held.answer)
    except ExecutionFailure as unavailable:
        await _failed(attempt, held, unavailable, keep=True)
        fail_attempt(unavailable.code, attempt=attempt.number)
    out, _, refused = guarded.validated
    if refused is not None or out is None:
        refused = refused or ExecutionFailure("VALIDATION_OUTPUT_INVALID")
        await _failed(attempt, held, refused, keep=False)
        fail_attempt(
            refused.code, attempt=attempt.number, abort_strategy=attempt.inp.abort_strategy
        )
    st = Settlement(
        usage=None,
        gate=None,
        limits=None,
        job_id=row.id,
        owner=attempt.owner,
        attempt=attempt.number,
        ttl_s=d.lock_policy(row.job_type)[0],
        output=out,
        output_hash=output_hash(out),
        chunk_no=attempt.chunk_no,
        token=held.fence.token if held.fence is not None else None,
        flagged=guarded.flagged,
    )
    async with heartbeating():
        settled = await db_retry(
            lambda: attempts_db.settle(d.sessionmaker, st), budget_s=d.config.db_retry_budget_s
        )
    if not settled.owned:
        fail_final("INTERNAL_NOT_LOCK_OWNER")
    if settled.cancel_requested:
        fail_final("CANCELLED")
    log.info(
        "held answer moderated and stored",
        extra={"job_id": str(row.id), "attempt": attempt.number, "chunk_no": attempt.chunk_no},
    )
    return ExecuteResult(output_hash=st.output_hash, attempt=attempt.number)


async def _failed(
    attempt: AttemptLike, held: Held, failure: ExecutionFailure, *, keep: bool
) -> None:
    """The attempt's bookkeeping (no call, so no usage row); the answer let go unless `keep`."""
    row, chunk_no = held.row, attempt.chunk_no
    async with heartbeating(), attempt._d.sessionmaker.begin() as s:
        await lifecycle_db.record_attempt(
            s,
            row.id,
            attempt=attempt.number,
            internal_error=failure.internal_message or failure.code,
            correction_hint=failure.correction_hint,
        )
        if chunk_no is not None:
            await chunks_db.record_failure(s, row.id, chunk_no, attempt.number, failure.code)
        if not keep:
            await held_answers_db.release(s, row.id, chunk_no)
    log.info(
        "held answer not stored",
        extra={"job_id": str(row.id), "attempt": attempt.number, "error_code": failure.code},
    )
