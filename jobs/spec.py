"""What a job type is: its frozen definition plus its input and output models, its prompt, its
projector and the plausible output the synthetic provider answers with (STYLE: one module per
job type, in `jobs/types/`)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from engine.definition import JobDefinition, Registry
from engine.errors import UnknownJobType
from providers.base import SyntheticBehaviour


@dataclass(frozen=True)
class Prompt:
    system: str
    user: str


@dataclass(frozen=True)
class ProjectionContext:
    job_id: uuid.UUID
    user_id: str
    target_type: str
    target_id: str
    output_hash: str


@dataclass(frozen=True)
class Artifact:
    artifact_type: str
    artifact_id: str
    ordinal: int


# A target check runs inside the create transaction with the creating user's id: a job type uses
# it to refuse targets that do not exist or do not belong to that user (raise ValidationFailed).
TargetCheck = Callable[[AsyncSession, str, str, str], Awaitable[None]]

# A projector writes business rows for a validated output inside the PROJECT transaction and
# returns the artifacts it wrote. It must be idempotent: ids derived from (job, ordinal) make a
# second projection of the same output write nothing new.
Projector = Callable[[AsyncSession, ProjectionContext, BaseModel], Awaitable[list[Artifact]]]

# An artifact view reads the business rows a job projected, for the artifacts API: given the
# job id and artifact ids, it returns {artifact_id: content} with the fields a client may see,
# in camelCase (never owner or internal columns). Ids it does not know are left out.
ArtifactView = Callable[[AsyncSession, uuid.UUID, list[str]], Awaitable[dict[str, dict[str, Any]]]]


@dataclass(frozen=True)
class JobType:
    definition: JobDefinition
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    build_prompt: Callable[[BaseModel, str | None], Prompt]
    project: Projector
    synthetic_output: Callable[[BaseModel], Mapping[str, Any]]
    # Only the synthetic job type scripts its provider (delay, failures, hang...).
    synthetic_behaviour: Callable[[BaseModel], SyntheticBehaviour] | None = None
    # The synthetic job type never calls a real provider, even when a key is configured.
    always_synthetic: bool = False
    # The targetTypes this job type accepts (None: any) and an optional ownership check.
    target_types: tuple[str, ...] | None = None
    check_target: TargetCheck | None = None
    # How the artifacts API shows this type's business rows (None: content is null).
    artifact_view: ArtifactView | None = None

    @property
    def job_type(self) -> str:
        return self.definition.job_type


def artifact_uuid(job_id: uuid.UUID, kind: str, ordinal: int) -> uuid.UUID:
    """Deterministic business-row id: the same (job, kind, ordinal) always maps to one row."""
    return uuid.uuid5(job_id, f"{kind}:{ordinal}")


async def project_rows(
    session: AsyncSession,
    table: type[Any],
    artifact_type: str,
    ctx: ProjectionContext,
    items: list[dict[str, Any]],
    *,
    with_target: bool = True,
) -> list[Artifact]:
    """The common projector: one business row per output item, keyed by (job, ordinal) with
    `artifact_uuid`, inserted with ON CONFLICT DO NOTHING, so projecting the same output twice
    writes nothing new. Adds the owner columns to each item; returns one Artifact per row."""
    rows = []
    for n, item in enumerate(items):
        row = {
            "id": artifact_uuid(ctx.job_id, artifact_type, n),
            "job_id": ctx.job_id,
            "user_id": ctx.user_id,
            "ordinal": n,
            **item,
        }
        if with_target:
            row["target_type"] = ctx.target_type
            row["target_id"] = ctx.target_id
        rows.append(row)
    if rows:
        await session.execute(pg_insert(table).values(rows).on_conflict_do_nothing())
    return [Artifact(artifact_type, str(r["id"]), n) for n, r in enumerate(rows)]


def artifact_uuids(artifact_ids: list[str]) -> list[uuid.UUID]:
    """The artifact ids that are UUIDs (the business rows' keys); others match no row."""
    out = []
    for a in artifact_ids:
        try:
            out.append(uuid.UUID(a))
        except ValueError:
            continue
    return out


class Catalog:
    """The registry of definitions plus the job types' code, keyed by jobType."""

    def __init__(self, types: list[JobType]) -> None:
        self.registry = Registry()
        self._types: dict[str, JobType] = {}
        for t in types:
            self.registry.register(t.definition)
            self._types[t.job_type] = t

    def get(self, job_type: str) -> JobType:
        try:
            return self._types[job_type]
        except KeyError:
            raise UnknownJobType(job_type) from None

    def __iter__(self) -> Iterator[JobType]:
        return iter(self._types.values())

    def __contains__(self, job_type: object) -> bool:
        return job_type in self._types
