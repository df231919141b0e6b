"""A create's pinned versions (`promptVersion`, `outputSchemaVersion`) checked against the job
type's published ones, before anything else of the create runs."""

from __future__ import annotations

from api.schemas import CreateJobBody
from jobs.spec import AnyJobType


def check_pins(body: CreateJobBody, jt: AnyJobType) -> None:
    """A pinned version must be one the job type publishes (`GET /api/ai/job-types` lists
    them): the job then builds and validates with exactly it, on every attempt. Anything else
    is 422 VALIDATION_FAILED at `["body", "promptVersion"]` / `["body", "outputSchemaVersion"]`
    (`JobType.version` raises it)."""
    jt.version(body.prompt_version, body.output_schema_version)
