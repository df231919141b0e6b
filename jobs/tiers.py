"""A create's service options, checked: its service tier (engine/tiers.py), result reuse and an
off-peak job's deadline. Pure (no I/O), called by `jobs.requests.RequestChecker.check`.

A tier the job type does not accept, `reuse: "allow"` on a type that does not permit reuse, or
an off-peak deadline on a job that is not off-peak is refused (422 VALIDATION_FAILED naming the
field): a create never silently runs on terms other than the ones it asked for.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.errors import ValidationFailed
from engine.tiers import BATCH, OFFPEAK, OFFPEAK_ON_DEADLINE, SERVICE_TIERS
from jobs.output import strict_output_schema
from providers.base import ProviderRequest
from providers.batch_lines import encode_line
from providers.openai_compat import chat_body

if TYPE_CHECKING:
    from pydantic import BaseModel

    from jobs.requests import CreateJobRequest
    from jobs.spec import AnyJobType


def _refuse(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(message, errors=[{"loc": [field], "msg": message, "type": "value"}])


def checked_tier(req: CreateJobRequest, jt: AnyJobType) -> str:
    """The effective tier of `req` (the job type's default when it names none), after the
    checks of its service options, in this order: the tier is one the type accepts, reuse is
    permitted, an off-peak deadline comes with the off-peak tier only."""
    service = jt.definition.service
    tier = req.service_tier or service.default_tier
    if tier not in SERVICE_TIERS:
        raise _refuse("serviceTier", f"serviceTier must be one of: {', '.join(SERVICE_TIERS)}")
    if not service.accepts(tier):
        raise _refuse(
            "serviceTier",
            f"{jt.definition.job_type} does not accept serviceTier {tier}; it accepts: "
            + ", ".join(t for t in SERVICE_TIERS if service.accepts(t)),
        )
    if req.reuse and not service.reuse:
        raise _refuse("reuse", f'{jt.definition.job_type} does not permit reuse: "allow"')
    deadline_given = req.offpeak_deadline_at is not None or req.offpeak_on_deadline is not None
    if deadline_given and tier != OFFPEAK:
        raise _refuse("offpeakDeadline", "offpeakDeadline needs serviceTier offpeak")
    if req.offpeak_on_deadline is not None and req.offpeak_on_deadline not in OFFPEAK_ON_DEADLINE:
        raise _refuse("offpeakDeadline", "offpeakDeadline.then must be standard or fail")
    return tier


def check_batch_source(tier: str, chunks: Sequence[object] | None) -> None:
    """A batch job is one line of its provider's batch file, one call: a long source runs as
    several calls (its chunks), so it is refused on the batch tier at create (never failed
    later at its enroll, nor run at the standard price)."""
    if tier == BATCH and chunks:
        raise _refuse(
            "serviceTier",
            f"serviceTier batch takes one call per job; this source is long enough for "
            f"{len(chunks)} calls: send it as standard or offpeak, or split it",
        )


def batch_line_bytes(jt: AnyJobType, model_in: BaseModel, model: str, max_tokens: int) -> int:
    """The bytes of the job's first batch line, as its enroll will write it, at most: the
    prompt the job type builds for this input, in the chat body a call sends with the largest
    structured-output form (the strict schema), under the longest custom id (a line asked again
    one form down)."""
    prompt = jt.prompt(model_in, None)
    output_model: type[BaseModel] = jt.output_model
    request = ProviderRequest(
        job_id="",
        job_type=jt.definition.job_type,
        attempt=1,
        model=model,
        system_prompt=prompt.system,
        user_prompt=prompt.user,
        output_schema={},
        timeout_s=0,
        max_tokens=max_tokens,
        structured_output="json_schema",
        schema_name=jt.definition.output.schema_version,
        strict_schema=strict_output_schema(output_model),
    )
    custom_id = f"job-{uuid.UUID(int=0)}-a1-json_object"
    return len(encode_line(custom_id, chat_body(request, stream=None)))


def check_batch_line(
    tier: str, jt: AnyJobType, model_in: BaseModel, model: str, max_tokens: int, max_bytes: int
) -> None:
    """A batch job's line must fit in a batch file (AI_BATCH_MAX_BYTES): a larger one could
    never be sent, so the job cannot go to the batch tier (refused at create, not failed at
    its enroll)."""
    if tier != BATCH or jt.always_synthetic:
        return
    size = batch_line_bytes(jt, model_in, model, max_tokens)
    if size > max_bytes:
        message = (
            f"serviceTier batch: this job's batch line is {size} bytes, more than a batch file "
            f"may hold ({max_bytes}, AI_BATCH_MAX_BYTES); send it as standard or shorten it"
        )
        raise ValidationFailed(
            message, errors=[{"loc": ["body", "serviceTier"], "msg": message, "type": "value"}]
        )


def tier_fingerprint(req: CreateJobRequest, jt: AnyJobType) -> dict[str, str]:
    """The service options that make a request differ from one that left them out: the tier
    when it is not the type's default, reuse, an off-peak deadline. Empty when all are the
    defaults, so earlier fingerprints are unchanged."""
    out: dict[str, str] = {}
    tier = req.service_tier or jt.definition.service.default_tier
    if tier != jt.definition.service.default_tier:
        out["serviceTier"] = tier
    if req.reuse:
        out["reuse"] = "allow"
    if req.offpeak_deadline_at is not None:
        out["offpeakDeadlineAt"] = req.offpeak_deadline_at.isoformat()
    if req.offpeak_on_deadline is not None:
        out["offpeakOnDeadline"] = req.offpeak_on_deadline
    return out
