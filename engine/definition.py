"""JobDefinition (ADR §2.1, frozen) and the registry that validates it (ADR §2.2)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from engine.errors import DuplicateJobDefinition, InvalidJobDefinition, UnknownJobType

QueueName = Literal["ai-interactive", "ai-background"]
CredentialMode = Literal["platform_key", "user_deepseek_key"]
QUEUE_NAMES: tuple[str, ...] = ("ai-interactive", "ai-background")
SYSTEM_QUEUE = "ai-system"
JOB_TYPE_PATTERN = re.compile(r"^[a-z][a-z0-9_]{1,63}$")


class _Frozen(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class Metadata(_Frozen):
    label: str
    description: str
    domain: Literal["analysis", "generation", "import", "maintenance"]
    version: str


class QueueSpec(_Frozen):
    queue_name: str
    default_priority: int = Field(ge=0, le=100)  # 0 = highest, 100 = lowest


class RetryBackoff(_Frozen):
    type: Literal["exponential"] = "exponential"
    delay: int = Field(ge=0)  # milliseconds


class Execution(_Frozen):
    timeout_ms: int
    max_retries: int = Field(ge=0, le=10)  # not counting the first attempt
    retry_backoff: RetryBackoff
    cancellable: bool = True
    abort_strategy: Literal["fail", "retry"] = "retry"


class InputSpec(_Frozen):
    schema_version: str


class OutputSpec(_Frozen):
    schema_version: str
    validator: str | None = None


class CredentialSpec(_Frozen):
    allowed_modes: tuple[CredentialMode, ...]
    default_mode: CredentialMode


class SecuritySpec(_Frozen):
    content_safety_check: bool = True
    output_redaction: bool = False


class JobDefinition(_Frozen):
    """The frozen fields of ADR §2.1 plus who may create the job over REST.

    `visibility`: "public" (any user), "dev" (public only when the settings say development or
    test, e.g. the synthetic type), "internal" (never through the REST create endpoint).
    """

    job_type: str
    metadata: Metadata
    queue: QueueSpec
    execution: Execution
    input: InputSpec
    output: OutputSpec
    credential: CredentialSpec
    projector: str | None = None
    security: SecuritySpec = SecuritySpec()
    visibility: Literal["public", "dev", "internal"] = "public"
    prompt_version: str = "v1"

    @property
    def max_attempts(self) -> int:
        return self.execution.max_retries + 1


def validate_definition(d: JobDefinition) -> None:
    """The ADR's registration checks; raises InvalidJobDefinition naming the bad field."""
    if not JOB_TYPE_PATTERN.fullmatch(d.job_type):
        raise InvalidJobDefinition(f"invalid jobType {d.job_type!r}")
    if d.queue.queue_name not in QUEUE_NAMES:
        raise InvalidJobDefinition(f"invalid queueName {d.queue.queue_name!r} for {d.job_type}")
    if not 1000 <= d.execution.timeout_ms <= 600_000:
        raise InvalidJobDefinition(f"timeoutMs {d.execution.timeout_ms} out of [1000, 600000]")
    if d.credential.default_mode not in d.credential.allowed_modes:
        raise InvalidJobDefinition(f"defaultMode of {d.job_type} is not an allowed mode")
    if not d.credential.allowed_modes:
        raise InvalidJobDefinition(f"{d.job_type} allows no credential mode")


class Registry:
    """jobType → JobDefinition; replaces any `switch(jobType)` (ADR §2.2)."""

    def __init__(self) -> None:
        self._defs: dict[str, JobDefinition] = {}

    def register(self, d: JobDefinition) -> None:
        if d.job_type in self._defs:
            raise DuplicateJobDefinition(f"duplicate jobType {d.job_type!r}")
        validate_definition(d)
        self._defs[d.job_type] = d

    def get(self, job_type: str) -> JobDefinition:
        try:
            return self._defs[job_type]
        except KeyError:
            raise UnknownJobType(job_type) from None

    def __contains__(self, job_type: object) -> bool:
        return job_type in self._defs

    def __iter__(self) -> Iterator[JobDefinition]:
        return iter(self._defs.values())

    def all(self) -> list[JobDefinition]:
        return list(self._defs.values())


def priority_key(priority: int) -> int:
    """Map the ADR's 0 (highest) .. 100 (lowest) onto Temporal's priority keys 1 (soonest) .. 5."""
    p = min(100, max(0, priority))
    return 1 + (p * 5) // 101
