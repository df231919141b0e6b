"""`GET /api/ai/job-types`: every registered job type describes itself (its definition's
metadata and policy, and the JSON Schema of its input), for any authenticated user. Read from
the catalog the process was built with: no database, no Temporal."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.deps import State, User
from api.schemas import Camel
from engine.definition import Domain
from engine.tiers import SERVICE_TIERS, ServiceTier
from jobs.spec import AnyJobType

router = APIRouter(prefix="/api/ai/job-types", tags=["job types"])

EXAMPLE: dict[str, Any] = {
    "items": [
        {
            "name": "quiz_generation",
            "label": "Quiz generation",
            "domain": "generation",
            "version": "1",
            "description": "Multiple-choice questions from a text.",
            "queue": "ai-interactive",
            "priority": 40,
            "timeoutSeconds": 120,
            "maxAttempts": 3,
            "promptVersion": "quiz_generation.v2",
            "promptVersions": ["quiz_generation.v1", "quiz_generation.v2"],
            "inputSchemaVersion": "quiz_generation.input.v1",
            "outputSchemaVersion": "quiz_generation.output.v1",
            "outputSchemaVersions": ["quiz_generation.output.v1"],
            "inputSchema": {
                "type": "object",
                "properties": {"text": {"type": "string", "minLength": 1}},
                "required": ["text"],
                "additionalProperties": False,
            },
            "defaultServiceTier": "standard",
            "serviceTiers": ["standard"],
            "reuse": False,
            "ttlSeconds": 3600,
        }
    ]
}


def _standard_only() -> list[ServiceTier]:
    return ["standard"]


class JobTypeOut(Camel):
    name: str = Field(description="The job type, as `jobType` in a create body")
    label: str = Field(description="A human name for it")
    domain: Domain = Field(description="What it does: analysis, generation, import, maintenance")
    version: str = Field(min_length=1, description="The definition's own version")
    description: str
    queue: str = Field(description="The task queue its jobs run on")
    priority: int = Field(ge=0, le=100, description="Default priority: 0 highest, 100 lowest")
    timeout_seconds: int | float = Field(description="One provider call's timeout")
    max_attempts: int = Field(ge=1, description="Provider attempts, the first included")
    prompt_version: str = Field(
        min_length=1, description="The default prompt version: a create that pins none gets it"
    )
    prompt_versions: list[str] = Field(
        default_factory=list,
        description="Every published prompt version, oldest first (the default last): a "
        "create may pin any of them in `promptVersion`, and its job runs exactly it",
    )
    input_schema_version: str = Field(min_length=1)
    output_schema_version: str = Field(
        min_length=1, description="The default output schema version"
    )
    output_schema_versions: list[str] = Field(
        default_factory=list,
        description="Every published output schema version, oldest first (the default last): "
        "a create may pin any of them in `outputSchemaVersion`",
    )
    input_schema: dict[str, Any] = Field(description="JSON Schema of the job type's `input`")
    default_service_tier: ServiceTier = Field(
        default="standard", description="A create's `serviceTier` when it names none"
    )
    service_tiers: list[ServiceTier] = Field(
        default_factory=_standard_only,
        description="The `serviceTier` values a create may ask for (the provider must offer "
        "the tier too: `batch` needs a batch API, `offpeak` a discount window)",
    )
    reuse: bool = Field(default=False, description='Whether a create may send `reuse: "allow"`')
    ttl_seconds: int | None = Field(
        default=None,
        description="The start-by TTL its jobs get when a create names no `ttlSeconds` "
        "(seconds from the create, or from `runAt`, to the job's start); null: none of its own "
        "(AI_DEFAULT_TTL_S applies)",
    )


class JobTypeList(Camel):
    items: list[JobTypeOut]


_SCHEMAS: dict[type[BaseModel], dict[str, Any]] = {}


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A model's JSON Schema, built once per process: a job type's input model never changes
    while the process runs, and building it costs more than the rest of the answer."""
    schema = _SCHEMAS.get(model)
    if schema is None:
        schema = _SCHEMAS[model] = model.model_json_schema(by_alias=True)
    return schema


def describe(jt: AnyJobType) -> JobTypeOut:
    """One job type as the listing shows it: its definition, never its prompts."""
    d = jt.definition
    ms = d.execution.timeout_ms
    return JobTypeOut(
        name=jt.job_type,
        label=d.label,
        domain=d.domain,
        version=d.version,
        description=d.description,
        queue=d.queue.queue_name,
        priority=d.queue.default_priority,
        timeout_seconds=ms // 1000 if ms % 1000 == 0 else ms / 1000,
        max_attempts=d.max_attempts,
        prompt_version=d.prompt_version,
        prompt_versions=list(jt.prompt_versions),
        input_schema_version=d.input.schema_version,
        output_schema_version=d.output.schema_version,
        output_schema_versions=list(jt.output_schema_versions),
        input_schema=input_schema(jt.input_model),
        default_service_tier=d.service.default_tier,
        service_tiers=[t for t in SERVICE_TIERS if d.service.accepts(t)],
        reuse=d.service.reuse,
        ttl_seconds=d.ttl_seconds,
    )


@router.get(
    "",
    response_model=JobTypeList,
    summary="List the job types",
    description=(
        "Every job type this deployment has registered, in registration order: its name (the "
        "`jobType` of a create body), label, domain (`analysis`, `generation`, `import`, "
        "`maintenance`), definition version, queue, default priority, timeout of one provider "
        "call in seconds, provider attempts, prompt and schema versions (the defaults, and "
        "every published one a create may pin), and the JSON Schema "
        "its `input` must satisfy. A type may be listed that you cannot create (a development "
        "type outside development): a create of it answers 422. Any authenticated user."
    ),
    responses={200: {"content": {"application/json": {"example": EXAMPLE}}}},
)
async def list_job_types(state: State, principal: User) -> JobTypeList:
    return JobTypeList(items=[describe(jt) for jt in state.catalog])
