"""A batch-tier job's side of its batch: its attempt enrolled in its provider's next batch, its
item's outcome collected as the job's output (or as a spent attempt), and its leaving on a
cancel. The batch itself (its window, the upload, the polls, the charge of every answer) is
the batch workflow's (workflows/batch.py, docs/batch.md).

Each function runs in the caller's transaction (the caller commits it) and reuses EXECUTE's
pieces rather than copies of them:

- `enroll`: the job taken `queued → running` as EXECUTE's take does (`jobs/lifecycle.py`
  `take`, its lock held to the batch's whole completion window so that no reconciler takes it
  for abandoned while it waits), the cost cover of a call after a paid one at the batch price
  (`jobs/admission.py` `cover_at`), the request body exactly as a call would send it (the
  prompt and its correction from `jobs/calls.py` `request`, the body from
  `providers/openai_compat.py` `chat_body`, without `stream`), then the attempt's item in its
  group's open batch (`db/batches.py` `enroll`, idempotent per attempt).
- `collect`: the attempt's item read; an answer is validated like EXECUTE's
  (`providers/openai_compat.py` `chat_answer`, `jobs/output.py` `validated_answer`) and stored
  as the job's output and hash with the attempt's bookkeeping (`db/lifecycle.py`
  `store_output`, `record_attempt`); a failed item or an invalid answer is the attempt's
  failure with its code (and a correction hint for the next prompt). No usage row here: the
  batch workflow charges every answered line when it reads the output file.
- `leave`: the job's live item cancelled (`db/batches.py` `leave`).

Only ids, hashes and codes leave these functions for the workflow's history.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from db import batches as batches_db
from db import job_output as job_output_db
from db import jobs as jobs_db
from db import lifecycle as lifecycle_db
from db import structured_downgrades as downgrades_db
from db.batches import BatchCaps, Enrolled, Left
from db.jobs import JobRow
from db.lifecycle import lock_holder
from db.provider_gate import PLATFORM_KEY_REF
from engine.errors import ExecutionFailure, IllegalTransition, JobNotFound, LockConflict
from engine.hashing import output_hash
from engine.lifecycle import LifecycleStatus
from engine.tiers import BATCH
from jobs import calls, structured_output
from jobs import lifecycle as lifecycle
from jobs.admission import AdmissionConfig, Call, cover_at
from jobs.attempt_start import Ended as Ended  # EXECUTE's own outcomes: ended before it ran,
from jobs.attempt_start import Stop as Stop  # or never will
from jobs.gateway import Gateway
from jobs.guardrails import Guard, Guarded, holds, stored_input_off_loop
from jobs.output import unstorable_failure
from jobs.spec import AnyJobType, Catalog
from providers.batch import has_batch_api
from providers.batch_lines import FORM_REFUSED, encode_line
from providers.openai_compat import chat_answer, chat_body
from providers.structured import lower as lower_of
from providers.structured import next_form

# The lock a batch job holds while its batch runs: the provider's completion window (24 h) and
# an hour of margin for the window before the upload and the polls after the end. Each look at
# an item still waiting extends it by as much again (`collect`).
BATCH_LOCK_TTL_S = 25 * 3600
# Progress of a job whose output is stored (as EXECUTE's settlement sets it).
STORED_PROGRESS = 60
RUNNING = LifecycleStatus.RUNNING.value


@dataclass(frozen=True)
class Attempt:
    """Whose attempt: the job, its workflow (the lock's owner), the lock's identity part and
    run id (diagnostics), the attempt number, the job's timeout and its task queue."""

    job_id: uuid.UUID
    owner: str
    identity: str
    run_id: str | None
    number: int
    timeout_ms: int = 0
    task_queue: str = ""


@dataclass(frozen=True)
class Stored:
    """The job's output is stored: by an earlier attempt of this job, or by this collect."""

    output_hash: str


@dataclass(frozen=True)
class Refused:
    """Another call would take the job past its cost cap or its user past a budget."""

    limit: str


@dataclass(frozen=True)
class Pending:
    """The item has no outcome yet (its lock was extended)."""


@dataclass(frozen=True)
class Failed:
    """The attempt failed with `code` (recorded on the job): retry in a later batch, or end."""

    code: str


async def enroll(
    s: AsyncSession,
    gateway: Gateway,
    catalog: Catalog,
    cfg: AdmissionConfig,
    a: Attempt,
    caps: BatchCaps | None = None,
) -> Enrolled | Ended | Stored | Stop | Refused:
    """The attempt's first transaction, in the caller's session: take, cover, body, item. The
    caller commits an `Enrolled`, `Ended` or `Stored` and rolls back a `Stop` or `Refused`
    (nothing taken: a job that never ran is ended by `finalize_failed`). A line larger than a
    whole batch may be (`caps.max_bytes`; a create refuses such a job, a retry's correction
    may still grow it) is `REQUEST_TOO_LARGE`."""
    caps = caps or BatchCaps()
    try:
        taken = await lifecycle.take(
            s,
            a.job_id,
            owner=a.owner,
            identity=f"b{a.number}@{a.identity}",
            ttl_s=BATCH_LOCK_TTL_S,
            run_id=a.run_id,
        )
    except IllegalTransition as exc:
        return Ended(str(exc.from_status))
    except LockConflict:
        return Stop("INTERNAL_NOT_LOCK_OWNER")
    except JobNotFound:
        return Stop("INTERNAL_JOB_MISSING")
    if taken is None:
        return Stop("INTERNAL_JOB_MISSING")
    row, snapshot = taken.row, taken.snapshot
    if row.cancel_requested_at is not None:
        return Stop("CANCELLED")
    if row.output_hash is not None and row.output is not None:
        return Stored(row.output_hash)  # paid for and stored: never bought again
    if snapshot is None:
        return Stop("INTERNAL_SNAPSHOT_MISSING")
    if row.chunk_count:
        # A long source is one call per chunk, which a batch line is not: refused, never run
        # at the standard tier instead.
        return Stop("REQUEST_TOO_LARGE")
    try:
        jt = catalog.for_job(row)  # its line is built with the versions it was created with
    except ExecutionFailure as f:
        return Stop(f.code)
    provider = gateway.provider_for(jt, row.credential_mode)
    if not has_batch_api(provider):
        # A create refuses the tier for such a provider; a job never runs standard instead.
        return Stop("REQUEST_REJECTED")
    model = gateway.model_for(jt, row.credential_mode)
    call = Call(row, jt, None, a.timeout_ms or jt.definition.execution.timeout_ms)
    if row.estimated_input_tokens is not None:
        price = gateway.prices.price_for(model).at_tier(BATCH)
        refused = await cover_at(s, cfg, call, row, price)
        if refused is not None:
            return Refused(refused)
    form = structured_output.form_for(gateway.forms, taken.downgrades, provider, model)
    call_of = calls.Attempt(row, snapshot, jt, a.number, None, 0)
    return await _line(s, gateway, a, call_of, form, caps)


async def _line(
    s: AsyncSession,
    gateway: Gateway,
    a: Attempt,
    call: calls.Attempt,
    form: str,
    caps: BatchCaps,
    again: bool = False,
) -> Enrolled | Stop:
    """The attempt's item in its group's open batch, its body asking in `form` (`again`: the
    attempt's line once more, after its first was refused for its form)."""
    row, jt = call.row, call.jt
    provider = gateway.provider_for(jt, row.credential_mode)
    model = gateway.model_for(jt, row.credential_mode)
    try:
        body = request_body(gateway, call, model, form)
    except ExecutionFailure as f:  # the prompt refused by the content-safety check
        return Stop(f.code)
    custom_id = batches_db.custom_id_of(a.job_id, a.number, form if again else None)
    line_bytes = len(encode_line(custom_id, body))
    if line_bytes > caps.max_bytes:
        return Stop("REQUEST_TOO_LARGE")
    gate = gateway.gate_key(jt, row.credential_mode, row.user_id, row.credential_id)
    return await batches_db.enroll(
        s,
        job_id=a.job_id,
        attempt=a.number,
        provider=provider.name,
        model=model,
        key_ref=gate.key_ref if gate is not None else PLATFORM_KEY_REF,
        task_queue=a.task_queue,
        body=body,
        line_bytes=line_bytes,
        caps=caps,
        again_as=form if again else None,
    )


def request_body(
    gateway: Gateway, a: calls.Attempt, model: str, form: str = "json_object"
) -> dict[str, Any]:
    """The chat request body of the attempt, exactly as a call would send it (the prompt built
    from the masked input with the correction after an invalid answer, checked for content
    safety when the type asks, its answer budget, the `response_format` of its
    structured-output form) but without `stream`: a batch line. No key goes in: the batch is
    sent with its group's key."""
    return chat_body(calls.request(gateway, a, model, None, form=form), stream=None)


async def collect(
    s: AsyncSession,
    gateway: Gateway,
    catalog: Catalog,
    a: Attempt,
    caps: BatchCaps | None = None,
) -> Stored | Pending | Failed | Stop | Enrolled:
    """The attempt's item after its batch signalled (or the backstop timer fired), in the
    caller's transaction, which the caller commits in every outcome but `Stop`. A line refused
    for its structured-output form is enrolled again in the next form down (`Enrolled`: the
    caller starts its batch, and the job waits on). Raises MODERATION_UNAVAILABLE when the
    answer's moderation cannot run (the item keeps its answer for the next look)."""
    row = await jobs_db.get_for_update(s, a.job_id)
    if row is None:
        return Stop("INTERNAL_JOB_MISSING")
    if row.lifecycle_status != RUNNING or lock_holder(row.locked_by) != a.owner:
        return Stop("INTERNAL_NOT_LOCK_OWNER")
    if row.cancel_requested_at is not None:
        return Stop("CANCELLED")
    if row.output_hash is not None and row.output is not None:
        return Stored(row.output_hash)  # a retried collect whose commit's answer was lost
    item = await batches_db.item_for(s, a.job_id, a.number)
    if item is None:
        return Stop("INTERNAL_JOB_MISSING")
    if item.status in batches_db.LIVE_ITEM:
        await lifecycle_db.extend_lock(s, a.job_id, owner=a.owner, ttl_s=BATCH_LOCK_TTL_S)
        return Pending()
    if item.status == "cancelled":
        return Stop("CANCELLED")
    try:
        jt = catalog.for_job(row)  # validated with the output schema it was created with
    except ExecutionFailure as f:
        return Stop(f.code)
    if item.status != "succeeded" or item.response is None:
        code = item.error_code or "PROVIDER_UNAVAILABLE"
        if code == FORM_REFUSED:
            again = await _lower(s, gateway, jt, row, a, item.form, caps or BatchCaps())
            if again is not None:
                return again
            code = "REQUEST_REJECTED"
        lost = ExecutionFailure(code, internal_message=f"batch item: {code}")
        if code == "VALIDATION_OUTPUT_INVALID":  # its answer could not even be stored
            lost = unstorable_failure()
        await _failed(s, a, lost)
        return Failed(code)
    flagged: int | None = None
    try:
        guarded = await _guarded(gateway, jt, row, chat_answer(item.response))
        (out, _, failure), flagged = guarded.validated, guarded.flagged
    except ExecutionFailure as f:
        if holds(f):
            raise  # the item keeps its answer: moderated again at the next look
        out, failure = None, f
    if failure is not None or out is None:
        failure = failure or ExecutionFailure("VALIDATION_OUTPUT_INVALID")
        await _failed(s, a, failure)
        return Failed(failure.code)
    digest = output_hash(out)
    stored = await job_output_db.store_output(
        s,
        a.job_id,
        owner=a.owner,
        output=out,
        output_hash=digest,
        progress=STORED_PROGRESS,
        flagged=flagged,
    )
    if not stored:
        return Stop("INTERNAL_NOT_LOCK_OWNER")
    await lifecycle_db.record_attempt(s, a.job_id, attempt=a.number, internal_error=None)
    return Stored(digest)


async def _guarded(gateway: Gateway, jt: AnyJobType, row: JobRow, content: str) -> Guarded:
    """A line's answer through its job type's guardrails (jobs/guardrails.py): moderated as
    the provider wrote it, its placeholders restored, validated."""
    # The row's input is the snapshot's (both as created): what the prompt was built from.
    _, masking = await stored_input_off_loop(jt, row.input, gateway.guardrails.pii_region)
    return await Guard.of(gateway.guardrails, jt, masking).answer(content)


async def _lower(
    s: AsyncSession,
    gateway: Gateway,
    jt: AnyJobType,
    row: JobRow,
    a: Attempt,
    refused: str,
    caps: BatchCaps,
) -> Enrolled | None:
    """The attempt's line enrolled again in the form below `refused` (the downgrade recorded
    for every process first); None: no lower form."""
    lower = next_form(refused)
    if lower is None:
        return None
    provider = gateway.provider_for(jt, row.credential_mode)
    model = gateway.model_for(jt, row.credential_mode)
    taken = await downgrades_db.record(
        s, structured_output.base_url_of(provider), model, lower, ttl_s=gateway.downgrade_ttl_s
    )
    form = lower_of(lower, taken)
    structured_output.warn(row.id, model, refused, form)
    call = calls.Attempt(row, {"input": row.input}, jt, a.number, None, 0)
    again = await _line(s, gateway, a, call, form, caps, again=True)
    return again if isinstance(again, Enrolled) else None


async def _failed(s: AsyncSession, a: Attempt, failure: ExecutionFailure) -> None:
    """A failed attempt's bookkeeping, as EXECUTE records one (its count, the internal
    message for operators, the correction the next prompt carries)."""
    await lifecycle_db.record_attempt(
        s,
        a.job_id,
        attempt=a.number,
        internal_error=failure.internal_message or failure.code,
        correction_hint=failure.correction_hint,
    )


async def leave(s: AsyncSession, job_id: uuid.UUID) -> Left | None:
    """The job's live item cancelled (None: it had none). A batch not yet uploaded simply
    goes without it; a submitted batch whose items have all left is cancelled at the provider
    by its next poll (the caller pokes it)."""
    return await batches_db.leave(s, job_id)
