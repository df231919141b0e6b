"""A job type's published versions (jobs/spec.py `JobType`): the earlier prompts and output
schemas it keeps beside its current ones, so that a job runs the versions it was created with
whatever is deployed while it waits (docs/versioning.md, "Prompt and output schema versions").
`JobType.version` is the one lookup of what a job builds and validates with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from pydantic import BaseModel

from engine.definition import VERSION_MAX_LENGTH
from engine.errors import InvalidJobDefinition

if TYPE_CHECKING:
    from jobs.spec import AnyJobType, Prompt

InT = TypeVar("InT", bound=BaseModel)
OutT = TypeVar("OutT", bound=BaseModel)


@dataclass(frozen=True)
class PromptVersion(Generic[InT]):
    """An earlier published prompt of a job type, kept so that a job created with it runs it:
    its version (recorded on the job) and its builder (the type's input model in)."""

    version: str
    build: Callable[[InT], Prompt]


@dataclass(frozen=True)
class OutputVersion(Generic[OutT]):
    """An earlier published output schema of a job type: its version and the model answers
    of the jobs created with it are validated with."""

    version: str
    model: type[OutT]


@dataclass(frozen=True)
class JobVersion(Generic[InT, OutT]):
    """What a job builds its prompt and validates its answer with: the builder of its prompt
    version and the model of its output schema version (`JobType.version`)."""

    prompt_version: str
    output_schema_version: str
    build_prompt: Callable[[InT], Prompt]
    output_model: type[OutT]


class Recorded(Protocol):
    """A job's row as far as its versions go (db/jobs.py `JobRow` is one)."""

    @property
    def job_type(self) -> str: ...
    @property
    def prompt_version(self) -> str: ...
    @property
    def output_schema_version(self) -> str: ...


def check_versions(jt: AnyJobType) -> None:
    """Every published version is named once, within the width of the job's version columns."""
    for kind, versions in (
        ("prompt", jt.prompt_versions),
        ("output schema", jt.output_schema_versions),
    ):
        if len(set(versions)) != len(versions):
            raise InvalidJobDefinition(f"{jt.job_type} publishes a {kind} version twice")
        if any(not 1 <= len(v) <= VERSION_MAX_LENGTH for v in versions):
            raise InvalidJobDefinition(
                f"{kind} versions of {jt.job_type} must have 1..{VERSION_MAX_LENGTH} characters"
            )
