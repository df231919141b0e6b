"""`synthetic`: drives tests, demos and benchmarks. Public in development/test only.

Input (all optional): delayMs, failTimes, failCode, hang, invalidOutput, echo. It always runs on
the synthetic provider and projects one `synthetic_result` artifact, whose content shows the
`echo` that went through the job.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, cast

from pydantic import Field, field_validator
from sqlalchemy import Table, select
from sqlalchemy.ext.asyncio import AsyncSession

from db import jobs as jobs_db
from db.models.projected import SyntheticResult
from engine.definition import Execution, Guardrails, JobDefinition, SecuritySpec
from jobs.spec import (
    Artifact,
    JobInput,
    JobOutput,
    JobType,
    Projection,
    ProjectionContext,
    Prompt,
    artifact_uuid,
    artifact_uuids,
    insert_rows,
)
from providers.base import SyntheticBehaviour

# `echo` is copied into the job's output (and its hash): a scripted test payload never needs more
# than this, measured as compact UTF-8 JSON.
MAX_ECHO_BYTES = 16 * 1024


class SyntheticInput(JobInput):
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


class SyntheticOutput(JobOutput):
    ok: bool
    echo: dict[str, Any] | None = None


DEFINITION = JobDefinition(
    job_type="synthetic",
    label="Synthetic test job",
    domain="maintenance",
    version="1",
    description="Scripted job for tests, demos and benchmarks.",
    execution=Execution(timeout_ms=30_000),
    security=SecuritySpec(content_safety_check=False),
    # A scripted type: its inputs are test data, never masked.
    guardrails=Guardrails(pii="off"),
    visibility="dev",
)


def build_prompt(inp: SyntheticInput) -> Prompt:
    return Prompt(system='Return a JSON object {"ok": true}.', user="synthetic")


def synthetic_output(inp: SyntheticInput) -> dict[str, Any]:
    return {"ok": True, "echo": inp.echo}


def behaviour(inp: SyntheticInput) -> SyntheticBehaviour:
    return SyntheticBehaviour(
        output=synthetic_output(inp),
        delay_ms=inp.delay_ms,
        fail_times=inp.fail_times,
        fail_code=inp.fail_code,
        hang=inp.hang,
        invalid_output=inp.invalid_output,
    )


def projection(ctx: ProjectionContext, out: SyntheticOutput) -> Projection:
    """One `synthetic_result` row: the hash of the output it was projected from."""
    rid = artifact_uuid(ctx.job_id, "synthetic_result", 0)
    row = {"id": rid, "job_id": ctx.job_id, "output_hash": ctx.output_hash}
    return Projection(
        [insert_rows(cast(Table, SyntheticResult.__table__), [row])],
        [Artifact("synthetic_result", str(rid), 0)],
    )


async def view(
    session: AsyncSession, job_id: uuid.UUID, artifact_ids: list[str]
) -> dict[str, dict[str, Any]]:
    """The `synthetic_result` row: the hash of the output it was projected from, and the
    `echo` that went through the job (read from the job's output, so a demo shows its data
    coming back; null once the job's private data is purged)."""
    rows = await session.execute(
        select(SyntheticResult.id, SyntheticResult.output_hash, SyntheticResult.created_at).where(
            SyntheticResult.job_id == job_id, SyntheticResult.id.in_(artifact_uuids(artifact_ids))
        )
    )
    found = list(rows)
    echo = None
    if found:
        output = await jobs_db.stored_output(session, job_id)
        echo = output.get("echo") if isinstance(output, dict) else None
    return {
        str(r.id): {
            "outputHash": r.output_hash,
            "createdAt": r.created_at.isoformat(),
            "echo": echo,
        }
        for r in found
    }


JOB = JobType(
    definition=DEFINITION,
    input_model=SyntheticInput,
    output_model=SyntheticOutput,
    build_prompt=build_prompt,
    projection=projection,
    synthetic_output=synthetic_output,
    artifact_view=view,
    synthetic_behaviour=behaviour,
    always_synthetic=True,
)
