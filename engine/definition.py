"""A job type's frozen definition: the policy the engine applies to every job of that type
(queue, priority, timeout, retries, credential modes, who may create it). Every field but
`job_type` has a default; `validate_definition` is what registration checks. The fields are
described in docs/adding-a-job-type.md."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from engine.errors import InvalidJobDefinition
from engine.queues import QUEUES, resolve_execution
from engine.tiers import ServiceTier

QueueName = Literal["ai-interactive", "ai-background"]
CredentialMode = Literal["platform_key", "user_deepseek_key"]
QUEUE_NAMES: tuple[QueueName, ...] = ("ai-interactive", "ai-background")
PLATFORM_KEY: CredentialMode = "platform_key"  # the platform's provider key
USER_DEEPSEEK_KEY: CredentialMode = "user_deepseek_key"  # the user's own DeepSeek key
CREDENTIAL_MODES: tuple[CredentialMode, ...] = (PLATFORM_KEY, USER_DEEPSEEK_KEY)
SYSTEM_QUEUE = "ai-system"
# The queue table (engine/queues.py) configures exactly the job queues.
assert set(QUEUES) == set(QUEUE_NAMES), "engine/queues.py must configure every job queue"
JOB_TYPE_PATTERN = re.compile(r"^[a-z][a-z0-9_]{1,63}$")
# The width of ai_job's version columns; a 64-character job type's default
# `<jobType>.output.v1` (74 characters) fits.
VERSION_MAX_LENGTH = 128
Visibility = Literal["public", "dev", "internal"]
# What a job type does, for the catalog's readers (ADR JobDefinition metadata).
Domain = Literal["analysis", "generation", "import", "maintenance"]
DOMAINS: tuple[Domain, ...] = ("analysis", "generation", "import", "maintenance")
LABEL_MAX_LENGTH = 100


class _Frozen(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class QueueSpec(_Frozen):
    queue_name: str = "ai-interactive"
    default_priority: int = Field(default=50, ge=0, le=100)  # 0 = highest, 100 = lowest


class RetryBackoff(_Frozen):
    type: Literal["exponential"] = "exponential"
    delay: int = Field(default=2000, ge=0)  # milliseconds before the first retry; doubles


class Execution(_Frozen):
    """`max_retries`, `retry_backoff` and `lock_ms` left out (None) are the queue's
    (engine/queues.py); read the effective values through `engine.queues.resolve_execution`,
    never from these fields."""

    timeout_ms: int = 60_000  # one provider call, 1 s .. 10 min
    # Not counting the first attempt. None: the queue's attempts minus one.
    max_retries: int | None = Field(default=None, ge=0, le=10)
    retry_backoff: RetryBackoff | None = None  # None: the queue's backoff
    # EXECUTE's heartbeat timeout and SQL lock TTL (milliseconds). None: the queue's lock.
    lock_ms: int | None = Field(default=None, ge=1000, le=600_000)
    # False: the job refuses a cancel (409 JOB_NOT_CANCELLABLE), queued or running.
    cancellable: bool = True
    # What a TIMEOUT does (only TIMEOUT: other retryable codes always spend the job's
    # attempts): "retry" spends an attempt, "fail" ends the job at once.
    abort_strategy: Literal["fail", "retry"] = "retry"
    # The most tokens one answer may take: sent as the request's `max_tokens`, and counted with
    # the prompt against the model's context window before a job is accepted.
    max_output_tokens: int = Field(default=4096, ge=1, le=131_072)


class SchemaVersion(_Frozen):
    schema_version: str


class CredentialSpec(_Frozen):
    allowed_modes: tuple[CredentialMode, ...] = ("platform_key",)
    default_mode: CredentialMode = "platform_key"


class SecuritySpec(_Frozen):
    content_safety_check: bool = True  # screen the input before the provider sees it
    # Mask e-mail addresses and phone numbers (only those) in the output before storing it.
    output_redaction: bool = False


class Guardrails(_Frozen):
    """What the engine does to a job's text on its way to the provider and back
    (docs/adding-a-job-type.md, "Guardrails"). `pii`: "mask" replaces e-mail addresses and
    phone numbers in the input by placeholders before the prompt is built, and the originals
    back in the output (never stored masked, never re-masked); "off" sends the input as
    written. `moderation` (with AI_MODERATION_MODEL set): "drop_item" drops each output item
    the moderation endpoint flags (the job fails only when every item is flagged), "fail"
    fails the job CONTENT_SAFETY_BLOCKED on any flagged item, "off" checks nothing."""

    pii: Literal["mask", "off"] = "off"
    moderation: Literal["drop_item", "fail", "off"] = "off"


class ServiceSpec(_Frozen):
    """The service tiers a job type accepts (engine/tiers.py) and whether a create may reuse an
    earlier answer. `default_tier` is a create's tier when it names none; `standard` is always
    accepted; `batch` and `offpeak` only when their flag is set; `reuse`: a create with
    `reuse: "allow"` may be answered from the same user's identical succeeded job."""

    default_tier: ServiceTier = "standard"
    batch: bool = False
    offpeak: bool = False
    reuse: bool = False

    def accepts(self, tier: str) -> bool:
        return (
            tier == "standard"
            or (tier == "batch" and self.batch)
            or (tier == "offpeak" and self.offpeak)
        )


class JobDefinition(_Frozen):
    """`visibility`: "public" (any user may create it), "dev" (only when the settings say
    development or test, e.g. the synthetic type), "internal" (never through the REST API).

    The input and output schema versions and the prompt version are recorded on every job;
    when left out they are `<job_type>.input.v1`, `<job_type>.output.v1` and `<job_type>.v1`.

    `label` (a human name; left out: the job type with spaces, capitalised), `domain` (one of
    DOMAINS) and `version` (the definition's own version, bumped when its policy or contract
    changes) describe the type in `GET /api/ai/job-types`."""

    job_type: str
    label: str = ""
    domain: Domain = "generation"
    version: str = "1"
    description: str = ""
    queue: QueueSpec = QueueSpec()
    execution: Execution = Execution()
    # Left out (or empty): filled in from job_type by the validator below.
    input: SchemaVersion = SchemaVersion(schema_version="")
    output: SchemaVersion = SchemaVersion(schema_version="")
    credential: CredentialSpec = CredentialSpec()
    security: SecuritySpec = SecuritySpec()
    visibility: Visibility = "public"
    prompt_version: str = ""
    # The provider fallback chain (docs/fallback.md): "default" (AI_FALLBACKS as configured),
    # "none" (its output must come from the one configured model), or the models of
    # AI_FALLBACKS entries it may fall back to, in its own order.
    fallback: Literal["default", "none"] | tuple[str, ...] = "default"
    # The service tiers it accepts, its default tier, and whether results may be reused.
    service: ServiceSpec = ServiceSpec()
    # PII masking and output moderation (a new type: both off).
    guardrails: Guardrails = Guardrails()
    # Its jobs' start-by TTL when a create names none (seconds from the create, or from
    # `runAt`, to admission; engine/flow.py); None: AI_DEFAULT_TTL_S.
    ttl_seconds: int | None = Field(default=None, ge=1, le=2_592_000)

    @model_validator(mode="before")
    @classmethod
    def _versions_default_to_the_job_type(cls, data: Any) -> Any:
        if isinstance(data, dict):
            name = data.get("job_type") or data.get("jobType")
            if isinstance(name, str):
                data = dict(data)
                for key, default in (
                    ("input", SchemaVersion(schema_version=f"{name}.input.v1")),
                    ("output", SchemaVersion(schema_version=f"{name}.output.v1")),
                    ("prompt_version", f"{name}.v1"),
                    ("label", name.replace("_", " ").capitalize()),
                ):
                    if not data.get(key):
                        data[key] = default
        return data

    @property
    def max_attempts(self) -> int:
        """Provider attempts, the first included: the definition's or its queue's."""
        return resolve_execution(self).max_attempts

    def creatable(self, *, development: bool) -> bool:
        """May a user create this type over REST? `development`: the settings say
        development or test, where the "dev" types are public too."""
        return self.visibility == "public" or (self.visibility == "dev" and development)


def validate_definition(d: JobDefinition) -> None:
    """What registration checks; raises InvalidJobDefinition naming the bad field."""
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
    if not d.label.strip() or len(d.label) > LABEL_MAX_LENGTH:
        raise InvalidJobDefinition(
            f"label of {d.job_type} must have 1..{LABEL_MAX_LENGTH} characters"
        )
    if d.domain not in DOMAINS:
        raise InvalidJobDefinition(f"invalid domain {d.domain!r} for {d.job_type}")
    if not d.service.accepts(d.service.default_tier):
        raise InvalidJobDefinition(f"defaultTier of {d.job_type} is not a tier it accepts")
    if d.guardrails.pii == "mask" and d.security.output_redaction:
        # A restored original is never masked again: masking and output redaction exclude
        # each other.
        raise InvalidJobDefinition(f"{d.job_type}: guardrails.pii mask with output_redaction")
    for field_name, version in (
        ("version", d.version),
        ("prompt_version", d.prompt_version),
        ("input.schema_version", d.input.schema_version),
        ("output.schema_version", d.output.schema_version),
    ):
        # Every job records its versions: one that cannot be stored would fail every create.
        if not 1 <= len(version) <= VERSION_MAX_LENGTH:
            raise InvalidJobDefinition(
                f"{field_name} of {d.job_type} must have 1..{VERSION_MAX_LENGTH} characters"
            )


def priority_key(priority: int) -> int:
    """Map 0 (highest) .. 100 (lowest) onto Temporal's priority keys 1 (soonest) .. 5."""
    p = min(100, max(0, priority))
    return 1 + (p * 5) // 101
