"""What a job type is: its frozen definition plus its input and output models, its prompt, its
projector and the plausible output the synthetic provider answers with. One module per job
type in `jobs/types/`, one line in `jobs/types/__init__.py`: docs/adding-a-job-type.md."""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from sqlalchemy import Table, TextClause, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from db import jobs as jobs_db
from db.pipeline import Statement
from engine.definition import JobDefinition, SchemaVersion, validate_definition
from engine.errors import (
    DuplicateJobDefinition,
    ExecutionFailure,
    UnknownJobType,
    VersionUnavailable,
)
from jobs.versions import JobVersion, Recorded, check_versions
from jobs.versions import OutputVersion as OutputVersion  # re-exported: the types publish these
from jobs.versions import PromptVersion as PromptVersion
from providers.base import SyntheticBehaviour


class JobInput(BaseModel):
    """Base of a job type's input model: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


class JobOutput(BaseModel):
    """Base of a job type's output model (what the provider must return): unknown fields
    refused."""

    model_config = ConfigDict(extra="forbid")


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
    # The job's stored input (camelCase keys, as created): what a projector may need beside
    # the output, without a read of its own.
    input: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Artifact:
    artifact_type: str
    artifact_id: str
    ordinal: int


@dataclass(frozen=True)
class ChunkSpec:
    """How a job type runs over a source longer than one prompt (jobs/chunked.py): which input
    field holds the source and which the requested item count, which output field lists the
    items, what makes two items the same (a question, a card's front), and the most items one
    call may be asked for (its output schema's bound)."""

    source_field: str
    count_field: str
    items_field: str
    item_key: Callable[[Mapping[str, Any]], str]
    max_items_per_call: int


InT = TypeVar("InT", bound=BaseModel)
OutT = TypeVar("OutT", bound=BaseModel)


# A target check runs inside the create transaction with the creating user's id: a job type uses
# it to refuse targets that do not exist or do not belong to that user (raise ValidationFailed).
TargetCheck = Callable[[AsyncSession, str, str, str], Awaitable[None]]


@dataclass(frozen=True)
class Projection:
    """What a projector plans for a validated output: the statements that write the job type's
    business rows (run in order, in the job's final transaction, before the engine's own) and
    the artifacts they write. Planning is pure (no I/O), so PROJECT sends the writes in the same
    round trip as the artifacts, the terminal state and the usage summary."""

    writes: list[Statement]
    artifacts: list[Artifact]


# A projector plans the business rows for a validated output. It must be idempotent: ids
# derived from (job, ordinal) and ON CONFLICT DO NOTHING make a second projection of the same
# output write nothing new (`rows_projection` does both).
Planner = Callable[[ProjectionContext, OutT], Projection]

# An artifact view reads the business rows a job projected, for the artifacts API: given the
# job id and artifact ids, it returns {artifact_id: content} with the fields a client may see,
# in camelCase (never owner or internal columns). Ids it does not know are left out.
ArtifactView = Callable[[AsyncSession, uuid.UUID, list[str]], Awaitable[dict[str, dict[str, Any]]]]

# The artifact type of a job type that keeps no business rows of its own.
OUTPUT_ARTIFACT = "job_output"


def output_projection(ctx: ProjectionContext, out: BaseModel) -> Projection:
    """The default projector: no business table, the job's stored output is its one artifact
    (`job_output`, id = the job id). Writes nothing, so it is idempotent."""
    return Projection([], [Artifact(OUTPUT_ARTIFACT, str(ctx.job_id), 0)])


async def view_output(
    session: AsyncSession, job_id: uuid.UUID, artifact_ids: list[str]
) -> dict[str, dict[str, Any]]:
    """The default artifact view: the job's stored output (None once retention purged it)."""
    if str(job_id) not in artifact_ids:
        return {}
    output = await jobs_db.stored_output(session, job_id)
    return {str(job_id): output} if output is not None else {}


@dataclass(frozen=True)
class JobType(Generic[InT, OutT]):
    """A job type: `definition` (policy), the input/output models, the prompt and the output
    the synthetic provider answers with. The projector and the artifact view default to "the
    stored output is the artifact"; a type with a business table passes its own."""

    definition: JobDefinition
    input_model: type[InT]
    output_model: type[OutT]
    build_prompt: Callable[[InT], Prompt]
    synthetic_output: Callable[[InT], Mapping[str, Any]]
    # The projector (see `Projection`).
    projection: Planner[OutT] = output_projection
    # How the artifacts API shows this type's artifacts (None: content is null).
    artifact_view: ArtifactView | None = view_output
    # The answer tokens this type expects for an input (a quote's estimated cost); None: a
    # quarter of the answer budget. The worst case always counts the whole budget.
    expected_output_tokens: Callable[[InT], int] | None = None
    # Set: a source too long for one prompt is split into chunks, one call each, and merged.
    chunking: ChunkSpec | None = None
    # Only the synthetic job type scripts its provider (delay, failures, hang...).
    synthetic_behaviour: Callable[[InT], SyntheticBehaviour] | None = None
    # The synthetic job type never calls a real provider, even when a key is configured.
    always_synthetic: bool = False
    # The targetTypes this job type accepts (None: any) and an optional ownership check.
    target_types: tuple[str, ...] | None = None
    check_target: TargetCheck | None = None
    # The earlier published versions, oldest first, kept so that a job created with one (pinned,
    # or the default of its day) builds and validates with it whatever is deployed later. The
    # current ones are `build_prompt` and `output_model`, under the definition's
    # `prompt_version` and `output.schema_version` (docs/adding-a-job-type.md).
    earlier_prompts: tuple[PromptVersion[InT], ...] = ()
    earlier_outputs: tuple[OutputVersion[OutT], ...] = ()

    @property
    def job_type(self) -> str:
        return self.definition.job_type

    @property
    def prompt_versions(self) -> tuple[str, ...]:
        """Every published prompt version, oldest first (the default last)."""
        return (*(p.version for p in self.earlier_prompts), self.definition.prompt_version)

    @property
    def output_schema_versions(self) -> tuple[str, ...]:
        """Every published output schema version, oldest first (the default last)."""
        current = self.definition.output.schema_version
        return (*(o.version for o in self.earlier_outputs), current)

    def version(
        self, prompt_version: str | None = None, output_schema_version: str | None = None
    ) -> JobVersion[InT, OutT]:
        """The one lookup of what a job runs with: the prompt builder of `prompt_version` and
        the output model of `output_schema_version` (None: the defaults). Raises
        VersionUnavailable naming each version the type does not publish."""
        d = self.definition
        pv = prompt_version or d.prompt_version
        ov = output_schema_version or d.output.schema_version
        build = self.build_prompt if pv == d.prompt_version else None
        build = build or next((p.build for p in self.earlier_prompts if p.version == pv), None)
        model = self.output_model if ov == d.output.schema_version else None
        model = model or next((o.model for o in self.earlier_outputs if o.version == ov), None)
        errors: list[dict[str, object]] = [
            {"loc": ["body", field], "msg": f"{field} must be one of {listed}", "type": "enum"}
            for field, found, listed in (
                ("promptVersion", build, self.prompt_versions),
                ("outputSchemaVersion", model, self.output_schema_versions),
            )
            if found is None
        ]
        if build is None or model is None:
            raise VersionUnavailable(
                f"The job type {d.job_type} has no such version: "
                + "; ".join(str(e["msg"]) for e in errors)
                + ".",
                errors=errors,
            )
        return JobVersion(pv, ov, build, model)

    def at(
        self, prompt_version: str | None, output_schema_version: str | None
    ) -> JobType[InT, OutT]:
        """This type as a job recorded with these versions runs it: their prompt builder and
        output model, and their names in its definition (what a create records and a reuse key
        hashes). The type itself when they are the defaults. Raises VersionUnavailable."""
        v = self.version(prompt_version, output_schema_version)
        d = self.definition
        current = (d.prompt_version, d.output.schema_version)
        if (v.prompt_version, v.output_schema_version) == current:
            return self
        versions = {
            "prompt_version": v.prompt_version,
            "output": SchemaVersion(schema_version=v.output_schema_version),
        }
        return dataclasses.replace(
            self,
            build_prompt=v.build_prompt,
            output_model=v.output_model,
            definition=d.model_copy(update=versions),
        )

    def prompt(self, inp: InT, correction: str | None = None) -> Prompt:
        """The type's prompt; after an invalid answer, `correction` (what was wrong with it)
        is appended to the user message so the next attempt can fix it."""
        p = self.build_prompt(inp)
        if correction:
            return Prompt(system=p.system, user=f"{p.user}\n\nCorrection: {correction}")
        return p


AnyJobType = JobType[Any, Any]


def artifact_uuid(job_id: uuid.UUID, kind: str, ordinal: int) -> uuid.UUID:
    """Deterministic business-row id: the same (job, kind, ordinal) always maps to one row."""
    return uuid.uuid5(job_id, f"{kind}:{ordinal}")


def rows_projection(
    table: type[Any],
    artifact_type: str,
    ctx: ProjectionContext,
    items: list[dict[str, Any]],
    *,
    with_target: bool = True,
) -> Projection:
    """The common projector: one business row per output item, keyed by (job, ordinal) with
    `artifact_uuid`, inserted with ON CONFLICT DO NOTHING, so projecting the same output twice
    writes nothing new. Adds the owner columns to each item; one Artifact per row."""
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
    artifacts = [Artifact(artifact_type, str(r["id"]), n) for n, r in enumerate(rows)]
    if not rows:
        return Projection([], artifacts)
    return Projection([insert_rows(table.__table__, rows)], artifacts)


def insert_rows(table: Table, rows: list[dict[str, Any]]) -> Statement:
    """One INSERT of `rows` (each with the same columns) into `table`, a conflict on any of its
    unique keys writing nothing: the statement and its parameters."""
    columns = tuple(rows[0])
    stmt = _insert_statement(table, columns, len(rows))
    return stmt, {f"{c}_{n}": r[c] for n, r in enumerate(rows) for c in columns}


@functools.lru_cache(maxsize=512)
def _insert_statement(table: Table, columns: tuple[str, ...], count: int) -> TextClause:
    for c in columns:
        if c not in table.c or not c.isidentifier():
            raise ValueError(f"{table.name} has no column {c!r}")
    values = ", ".join("(" + ", ".join(f":{c}_{n}" for c in columns) + ")" for n in range(count))
    stmt = text(
        f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES {values} ON CONFLICT DO NOTHING"
    )
    jsonb = [
        bindparam(f"{c}_{n}", type_=JSONB)
        for c in columns
        if isinstance(table.c[c].type, JSONB)
        for n in range(count)
    ]
    return stmt.bindparams(*jsonb) if jsonb else stmt


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
    """The one registry: jobType -> JobType. Registration validates each definition and refuses
    a second type of the same name; lookups of an unknown name raise UnknownJobType."""

    def __init__(self, types: Iterable[AnyJobType] = ()) -> None:
        self._types: dict[str, AnyJobType] = {}
        for t in types:
            self.register(t)

    def register(self, job_type: AnyJobType) -> None:
        if job_type.job_type in self._types:
            raise DuplicateJobDefinition(f"duplicate jobType {job_type.job_type!r}")
        validate_definition(job_type.definition)
        check_versions(job_type)
        self._types[job_type.job_type] = job_type

    def get(self, job_type: str) -> AnyJobType:
        try:
            return self._types[job_type]
        except KeyError:
            raise UnknownJobType(job_type) from None

    def for_job(self, row: Recorded) -> AnyJobType:
        """The job's type as the job runs it: the versions it was created with (`JobType.at`),
        on every attempt, chunk, retry and fallback. A version no longer published fails the
        job `PROMPT_VERSION_UNAVAILABLE`, never retried: it never runs on another one."""
        try:
            return self.get(row.job_type).at(row.prompt_version, row.output_schema_version)
        except VersionUnavailable as exc:
            raise ExecutionFailure(
                "PROMPT_VERSION_UNAVAILABLE", internal_message=exc.public_message
            ) from None

    def __iter__(self) -> Iterator[AnyJobType]:
        return iter(self._types.values())

    def __contains__(self, job_type: object) -> bool:
        return job_type in self._types
