"""A create's pinned versions (`promptVersion`, `outputSchemaVersion`) checked against the job
type's registered ones, before anything else of the create runs."""

from __future__ import annotations

from api.schemas import CreateJobBody
from engine.definition import JobDefinition
from engine.errors import ValidationFailed


def check_pins(body: CreateJobBody, d: JobDefinition) -> None:
    """A pinned version must be the job type's registered one: a job pinned to a prompt or an
    output schema the server no longer has would run on another, which is what the pin is
    there to refuse."""
    errors: list[dict[str, object]] = [
        {"loc": ["body", field], "msg": f"{field} must be {registered!r}", "type": "enum"}
        for field, pinned, registered in (
            ("promptVersion", body.prompt_version, d.prompt_version),
            ("outputSchemaVersion", body.output_schema_version, d.output.schema_version),
        )
        if pinned is not None and pinned != registered
    ]
    if errors:
        raise ValidationFailed(
            f"The job type {d.job_type} has no such version: "
            + "; ".join(str(e["msg"]) for e in errors)
            + ".",
            errors=errors,
        )
