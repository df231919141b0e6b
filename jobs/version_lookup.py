"""The one place the rollout code asks a job type which prompt versions it has published.

A job type lists its prompt versions oldest first, the default last published; an arm of a
rollout (jobs/rollouts.py) may name any of them. Kept in one function so that the version
registry of the job types (every published prompt and output-schema version kept, each with
its prompt builder and output model) answers it when it lands: this returns what the
definition records today, its one default version.
"""

from __future__ import annotations

from jobs.spec import AnyJobType


def prompt_versions(jt: AnyJobType) -> tuple[str, ...]:
    """The job type's listed prompt versions, oldest first."""
    versions = getattr(jt, "prompt_versions", None)
    if isinstance(versions, tuple | list) and versions:
        return tuple(str(v) for v in versions)
    return (jt.definition.prompt_version,)


def at_version(
    jt: AnyJobType, prompt_version: str | None, output_schema_version: str | None = None
) -> AnyJobType:
    """The job type as a job recorded with these versions runs it (its prompt builder and
    output model): the registry's `JobType.at` once it has one; the type itself before, when
    only its defaults exist."""
    at = getattr(jt, "at", None)
    if at is None or (prompt_version is None and output_schema_version is None):
        return jt
    got: AnyJobType = at(prompt_version, output_schema_version)
    return got
