"""`synthetic`: drives tests, demos and benchmarks (DESIGN §7). Public in development/test only.

Input (all optional): delayMs, failTimes, failCode, hang, invalidOutput, echo. It always runs on
the synthetic provider and projects one `synthetic_result` artifact.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from engine.definition import (
    CredentialSpec,
    Execution,
    InputSpec,
    JobDefinition,
    Metadata,
    OutputSpec,
    QueueSpec,
    RetryBackoff,
    SecuritySpec,
)
from jobs.spec import (
    Artifact,
    JobType,
    ProjectionContext,
    Prompt,
    artifact_uuid,
    artifact_uuids,
)
from providers.base import SyntheticBehaviour

# `echo` is copied into the job's output (and its hash): a scripted test payload never needs more
# than this, measured as compact UTF-8 JSON.
MAX_ECHO_BYTES = 16 * 1024


class SyntheticInput(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    delay_ms: int = Field(default=0, ge=0, le=600_000)
    fail_times: int = Field(default=0, ge=0, le=100)
    fail_code: str = Field(default="PROVIDER_UNAVAILABLE", pattern=r"^[A-Z][A-Z0-9_]{1,63}$")
    hang: bool = False
    invalid_output: bool = False
    echo: dict[str, Any] | None = None

    @field_validator("echo")
    @classmethod
    def _bounded_echo(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        try:
            size = len(json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
        except (TypeError, ValueError, UnicodeEncodeError):
            raise ValueError("echo must be encodable as UTF-8 JSON") from None
        if size > MAX_ECHO_BYTES:
            # The message states the bound, never the value.
            raise ValueError(f"echo must not exceed {MAX_ECHO_BYTES} bytes as compact JSON")
        return v


class SyntheticOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ok: bool
    echo: dict[str, Any] | None = None


DEFINITION = JobDefinition(
    job_type="synthetic",
    metadata=Metadata(
        label="Synthetic job",
        description="Scripted job for tests, demos and benchmarks.",
        domain="maintenance",
        version="1.0.0",
    ),
    queue=QueueSpec(queue_name="ai-interactive", default_priority=50),
    execution=Execution(
        timeout_ms=30_000,
        max_retries=1,
        retry_backoff=RetryBackoff(delay=2000),
        cancellable=True,
        abort_strategy="retry",
    ),
    input=InputSpec(schema_version="synthetic.input.v1"),
    output=OutputSpec(schema_version="synthetic.output.v1", validator="SyntheticOutput"),
    credential=CredentialSpec(allowed_modes=("platform_key",), default_mode="platform_key"),
    projector="synthetic_result",
    security=SecuritySpec(content_safety_check=False, output_redaction=False),
    visibility="dev",
)


def build_prompt(inp: BaseModel, correction: str | None) -> Prompt:
    return Prompt(system='Return a JSON object {"ok": true}.', user=correction or "synthetic")


def synthetic_output(inp: BaseModel) -> dict[str, Any]:
    assert isinstance(inp, SyntheticInput)
    return {"ok": True, "echo": inp.echo}


def behaviour(inp: BaseModel) -> SyntheticBehaviour:
    assert isinstance(inp, SyntheticInput)
    return SyntheticBehaviour(
        output=synthetic_output(inp),
        delay_ms=inp.delay_ms,
        fail_times=inp.fail_times,
        fail_code=inp.fail_code,
        hang=inp.hang,
        invalid_output=inp.invalid_output,
    )


async def project(session: AsyncSession, ctx: ProjectionContext, out: BaseModel) -> list[Artifact]:
    rid = artifact_uuid(ctx.job_id, "synthetic_result", 0)
    await session.execute(
        text(
            """
            INSERT INTO synthetic_result (id, job_id, output_hash, created_at)
            VALUES (:id, :job, :h, now()) ON CONFLICT (id) DO NOTHING
            """
        ),
        {"id": rid, "job": ctx.job_id, "h": ctx.output_hash},
    )
    return [Artifact("synthetic_result", str(rid), 0)]


async def view(
    session: AsyncSession, job_id: uuid.UUID, artifact_ids: list[str]
) -> dict[str, dict[str, Any]]:
    """The `synthetic_result` row: the hash of the output it was projected from."""
    rows = await session.execute(
        text(
            "SELECT id, output_hash, created_at FROM synthetic_result "
            "WHERE job_id = :job AND id = ANY(:ids)"
        ),
        {"job": job_id, "ids": artifact_uuids(artifact_ids)},
    )
    return {
        str(r.id): {"outputHash": r.output_hash, "createdAt": r.created_at.isoformat()}
        for r in rows
    }


JOB = JobType(
    definition=DEFINITION,
    input_model=SyntheticInput,
    output_model=SyntheticOutput,
    build_prompt=build_prompt,
    project=project,
    synthetic_output=synthetic_output,
    artifact_view=view,
    synthetic_behaviour=behaviour,
    always_synthetic=True,
)
