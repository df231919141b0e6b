"""The job's public models, as every reader of a job sees them (jobs/views.py builds them).

Their names are the OpenAPI schema names: keep them. `JobStatusResponse` is the frozen shape of
docs/contracts.md (new fields go after the frozen ones); the admin view adds the internals only
SUPER_ADMIN may see.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema
from pydantic.alias_generators import to_camel

from engine.lifecycle import StatusName
from engine.tiers import ServiceTier

_USD_QUANTUM = Decimal("0.00000001")


def usd_text(value: Decimal) -> str:
    """USD as a decimal string with exactly 8 places (the precision usage rows are priced to):
    a JSON number would lose digits in clients that parse it as a float."""
    return f"{value.quantize(_USD_QUANTUM):f}"


UsdAmount = Annotated[
    Decimal,
    PlainSerializer(usd_text, return_type=str),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": r"^-?\d+\.\d{8}$",
            "description": "USD, a decimal string with 8 places",
            "examples": ["0.00066000"],
        }
    ),
]


class Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class ArtifactOut(Camel):
    artifact_type: str
    artifact_id: str


class ResultOut(Camel):
    artifact_count: int
    artifacts: list[ArtifactOut]
    # Left out unless true: the frozen shape stays `{artifactCount, artifacts}` for every job
    # that is not partial.
    partial: bool = Field(
        default=False,
        exclude_if=lambda v: not v,
        description="Present, and true, only on a long-source job that failed, was cancelled "
        "or timed out after some of its chunks succeeded: the artifacts are the items those "
        "chunks produced, kept; `lifecycleStatus` and `errorCode` still say why it stopped. "
        "Absent otherwise.",
    )
    model: str | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="The model that produced the output (as the provider named it): the "
        "configured one, or a fallback's when the provider failed (docs/fallback.md). Given "
        "by `GET /api/ai/jobs/{jobId}` for a succeeded job; absent elsewhere.",
    )
    structured_output: str | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="The structured-output form the answer that made the output was asked "
        "in: `json_schema` (the output schema, enforced by the provider), `json_object` or "
        "`none` (docs/fallback.md). A long source: its last answering call's; a batch job: "
        "its line's; a reused job: its source's. Given by `GET /api/ai/jobs/{jobId}` for a "
        "succeeded job; absent elsewhere.",
        examples=["json_schema"],
    )
    flagged_items: int | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="How many output items moderation flagged and dropped (0 when none); "
        "absent when the job's output was not moderated (docs/api.md, guardrails).",
    )


class ConcurrencyOut(Camel):
    """A create's `concurrency` as it was given: a member not given is null."""

    key: str | None = Field(default=None, description="The concurrency key")
    mode: Literal["supersede", "skip", "debounce"] | None = Field(
        default=None, description="What a create with the key does: supersede, skip, debounce"
    )
    delay_ms: int | None = Field(
        default=None, description="A debounced job's wait after its create, in milliseconds"
    )
    max_delay_ms: int | None = Field(
        default=None, description="The longest a debounce chain waits, from its first create"
    )


# The frozen public shape (docs/contracts.md): fields and their order are what clients parse.
class JobStatusResponse(Camel):
    job_id: uuid.UUID
    job_type: str
    lifecycle_status: StatusName
    queue_name: str
    priority: int
    progress: int
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error_code: str | None = None
    public_error_message: str | None = None
    result: ResultOut | None = None
    # What joins the job to the client's product, and what it runs on and when: after the
    # fields above, whose order is frozen.
    target_type: str
    target_id: str
    metadata: dict[str, str] = Field(
        default_factory=dict,
        description="Your own references, as the create gave them (`{}`: none)",
        examples=[{"courseId": "C42"}],
    )
    run_at: datetime | None = Field(
        default=None,
        description="When a delayed job may start (RFC 3339); null: as soon as it can",
        examples=["2026-12-05T08:00:00Z"],
    )
    prompt_version: str = Field(
        description="The job type's prompt version the job runs on", examples=["quiz_generation.v1"]
    )
    output_schema_version: str = Field(
        description="The job type's output schema version the job's output is validated with",
        examples=["quiz_generation.output.v1"],
    )
    private_data_purged: bool = Field(
        default=False,
        description="True once the job's private data was purged (its owner's DELETE, or "
        "retention after DATA_RETENTION_DAYS): its input, output, chunk outputs and internal "
        "error message are gone; the job, its codes and its usage stay.",
    )
    service_tier: ServiceTier = Field(
        default="standard",
        description="How soon and at which price its provider calls are made: `standard` (at "
        "once), `batch` (the provider's batch API, within 24 h, at its batch price) or "
        "`offpeak` (held until the provider's next discount window)",
        examples=["batch"],
    )
    reused_from_job_id: uuid.UUID | None = Field(
        default=None,
        description="Your earlier identical job whose answer this one reused (a create with "
        '`reuse: "allow"`): no provider call, cost 0, its own copies of the artifacts',
    )
    tags: list[str] = Field(
        default_factory=list,
        description="The create's tags, for cost attribution, in the order given (`[]`: none)",
        examples=[["course:bio-101", "term.autumn"]],
    )
    rollout_arm: str | None = Field(
        default=None,
        description="The arm of its job type's rollout the job was created on (null outside "
        "a rollout: none stood, or the create pinned a version); `promptVersion` is the arm's",
        examples=["canary"],
    )
    # Flow control (docs/api.md "Flow control").
    concurrency: ConcurrencyOut | None = Field(
        default=None,
        description="The create's `concurrency` as given (a member not given is null); null "
        "without one",
    )
    superseded_by: uuid.UUID | None = Field(
        default=None,
        description="The newer job with the same concurrency key that replaced this one "
        "(`errorCode` `SUPERSEDED`); null otherwise",
    )
    expires_at: datetime | None = Field(
        default=None,
        description="Start-by time (its TTL): not started by then, the job ends `cancelled` "
        "with `JOB_EXPIRED`; null without a TTL",
    )
    deadline: datetime | None = Field(
        default=None,
        description="The whole job's deadline: past it, it stops and ends `cancelled` with "
        "`JOB_DEADLINE_EXCEEDED`; null without one",
    )


# SUPER_ADMIN's view: the public shape plus the internals (never shown to the owner).
class AdminJobResponse(JobStatusResponse):
    user_id: str
    # The organisation and teams of the token that created it (docs/money.md).
    org_id: str | None = None
    team_ids: list[str] = Field(default_factory=list)
    internal_error_message: str | None = None
    workflow_id: str
    temporal_ui_url: str
    attempt_count: int
    cancel_requested_at: datetime | None = None
    retried_from_job_id: uuid.UUID | None = None
    output_hash: str | None = None
    cost_usd: UsdAmount = Field(
        default=Decimal(0),
        description="What the job's provider calls have cost so far, failed ones included "
        "(the sum of `GET /api/ai/jobs/{jobId}/usage`'s `costUsd`)",
    )


class ArtifactItem(Camel):
    artifact_type: str
    artifact_id: str
    ordinal: int
    content: dict[str, Any] | None = Field(
        default=None,
        description="The projected business row as the job type exposes it (camelCase); null "
        "when the job type has no view or the row is gone. For an item that is not final, the "
        "chunk's output item with its fields in camelCase.",
    )
    final: bool = Field(
        default=True,
        description="True: a projected artifact, as the job keeps it. False: an item of a "
        "long-source chunk that succeeded while the job still runs; the final artifacts "
        "replace these once the job ends (repeats across chunks dropped, renumbered).",
    )
    chunk: int | None = Field(
        default=None,
        description="The chunk an item that is not final came from (`ordinal` is then its "
        "index within that chunk's output); null for final artifacts and one-call jobs.",
    )
