"""Request models and the API's own response envelopes (JSON in camelCase). A job's own models
(JobStatusResponse, its frozen public shape, and the admin view) live in jobs/views.py, the one
place that builds a job's JSON; the pages here wrap them with the API's opaque cursors."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)
from pydantic.alias_generators import to_camel

from api import cursors
from api.flow_schemas import CONCURRENCY_DOC, ConcurrencyBody

# The quote's models (api/quote_schemas.py) keep their import path here.
from api.quote_schemas import QuoteBudget as QuoteBudget
from api.quote_schemas import QuoteRefusal as QuoteRefusal
from api.quote_schemas import QuoteResponse as QuoteResponse
from api.quote_schemas import TierPriceOut as TierPriceOut
from api.usage_schemas import UsdAmount as UsdAmount
from engine.definition import JOB_TYPE_PATTERN as _JOB_TYPE_RE
from engine.definition import VERSION_MAX_LENGTH, CredentialMode, QueueName
from engine.flow import TTL_S_MAX
from engine.lifecycle import StatusName
from engine.scopes import MAX_TAGS, SCOPE_ID_PATTERN
from engine.tiers import OffpeakOnDeadline, ServiceTier
from jobs.views import AdminJobResponse, ArtifactItem, ArtifactKey, JobKey, JobStatusResponse
from jobs.views import Camel as Camel  # the camelCase base of every API model, the job views' too

Status = StatusName
Queue = QueueName
# Deeper `input` documents fail pydantic's serializer (depth ~255) inside create: refuse them here.
MAX_INPUT_DEPTH = 64
# A job's `input` is kept (jsonb) and turned into provider prompts: bound it below
# MAX_REQUEST_BYTES, measured as compact UTF-8 JSON (close to what the jsonb column holds). Room
# for a long source of 400,000 characters in any script (CJK takes 3 bytes a character).
MAX_INPUT_BYTES = 1536 * 1024
# A query filter that PostgreSQL can compare: text columns cannot hold NUL (driver DataError).
NO_NUL = r"^[^\x00]*$"
# A jobType filter that no job type could match is a 422.
JOB_TYPE_PATTERN = _JOB_TYPE_RE.pattern


def whole(value: object) -> object:
    """A JSON integer: an int, or a number with nothing after the point (`2.0`, as JSON Schema
    counts it); never a boolean or a string."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be an integer")
        return int(value)
    return value


WholeNumber = Annotated[int, BeforeValidator(whole)]


def storable_text(value: str) -> bool:
    """PostgreSQL text and jsonb reject NUL and unpaired surrogates (JSON `\\ud800` parses into
    one); the driver then raises deep inside a write, which would surface as a 500."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_storable_json(value: Any, *, max_depth: int = MAX_INPUT_DEPTH) -> None:
    """Raises ValueError (without echoing the value) when a JSON document cannot be stored.
    Iterative on purpose: a recursive walk could itself hit Python's recursion limit."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise ValueError(f"must not be nested more than {max_depth} levels deep")
        if isinstance(item, str):
            if not storable_text(item):
                raise ValueError("must not contain NUL characters or unpaired surrogates")
        elif isinstance(item, dict):
            for k, v in item.items():
                if isinstance(k, str) and not storable_text(k):
                    raise ValueError("must not contain NUL characters or unpaired surrogates")
                stack.append((v, depth + 1))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def storable_str(v: str) -> str:
    """A text field PostgreSQL can store (the validator of every body that takes one)."""
    if not storable_text(v):
        raise ValueError("must not contain NUL characters or unpaired surrogates")
    return v


def storable_input(v: dict[str, Any]) -> dict[str, Any]:
    """A job input (a create's, a schedule's): storable and within MAX_INPUT_BYTES."""
    check_storable_json(v)
    if compact_json_size(v) > MAX_INPUT_BYTES:
        # The message states the bound, never the value.
        raise ValueError(f"must not exceed {MAX_INPUT_BYTES} bytes as compact JSON")
    return v


def compact_json_size(value: Any) -> int:
    """Bytes of `value` as compact UTF-8 JSON. Call it after `check_storable_json`: unpaired
    surrogates cannot be encoded, and that check refuses them with a clear message."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


class CancelResponse(JobStatusResponse):
    cancel_outcome: Literal["cancelled", "cancel_requested"]


class RetryBody(Camel):
    """An admin retry's optional body. `overrideBudget`: create the retry even past the owner's
    quotas and cost budgets (recorded on the audit entry); without it a retry is refused as
    the owner's create would be."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    override_budget: bool = Field(default=False, strict=True)  # `0` is not a boolean


class RetriedJobResponse(JobStatusResponse):
    retried_from_job_id: uuid.UUID


class JobPage(Camel):
    items: list[JobStatusResponse]
    next_cursor: str | None = None


class AdminJobPage(Camel):
    items: list[AdminJobResponse]
    next_cursor: str | None = None


# A create's `metadata`: the client's own references, small and flat (API-checked; the column
# is jsonb). Keys are what a list filter `metadata.<key>=` names, so they stay URL-plain.
MAX_METADATA_KEYS = 16
MAX_METADATA_KEY_LENGTH = 64
MAX_METADATA_VALUE_LENGTH = 512
METADATA_KEY_PATTERN = r"^[A-Za-z0-9_.-]+$"
MetadataKey = Annotated[
    str,
    StringConstraints(
        min_length=1, max_length=MAX_METADATA_KEY_LENGTH, pattern=METADATA_KEY_PATTERN
    ),
]
MetadataValue = Annotated[
    str, StringConstraints(max_length=MAX_METADATA_VALUE_LENGTH), AfterValidator(storable_str)
]
Metadata = dict[MetadataKey, MetadataValue]


def metadata_schema(schema: dict[str, Any]) -> None:
    """The JSON Schema of `metadata` as the server checks it: pydantic puts the key pattern
    under `patternProperties`, which would let any other key through as schema-valid."""
    values = schema.pop("patternProperties", {}).get(METADATA_KEY_PATTERN, {"type": "string"})
    schema["propertyNames"] = {
        "minLength": 1,
        "maxLength": MAX_METADATA_KEY_LENGTH,
        "pattern": METADATA_KEY_PATTERN,
    }
    schema["additionalProperties"] = {**values, "pattern": NO_NUL}


# A create's (or a schedule's job template's) `tags`: ids of cost attribution, each a scope id.
Tag = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=SCOPE_ID_PATTERN)]
TAGS_DESCRIPTION = (
    f"Cost attribution: at most {MAX_TAGS} tags of 1-64 characters `[A-Za-z0-9_.:-]`, no "
    "repeats, kept in the order given. A tag's budget (PUT /admin-api/ai/budgets/tag/{tag}) "
    "applies to the job, and usage is grouped by them. Never sent to the AI provider."
)


def distinct_tags(v: list[str]) -> list[str]:
    """Tags without repeats: a repeated tag is a mistake (it would count the job twice)."""
    if len(set(v)) != len(v):
        raise ValueError("must not repeat a tag")
    return v


Tags = Annotated[
    list[Tag],
    Field(max_length=MAX_TAGS, description=TAGS_DESCRIPTION, examples=[["course:bio-101"]]),
    AfterValidator(distinct_tags),
]


# How far ahead a create's `runAt` may be: a delayed job holds its reservation until it runs.
MAX_RUN_AT_DAYS = 30


def rfc3339_text(v: Any) -> Any:
    """A time of a create body is RFC 3339 text: a number would parse as a Unix time."""
    if v is not None and not isinstance(v, str):
        raise ValueError("must be an RFC 3339 date-time with an offset")
    return v


def within_run_at_days(v: datetime | None) -> datetime | None:
    """A time of a create body (`runAt`, an off-peak deadline) is not in the past and at most
    MAX_RUN_AT_DAYS ahead (the job holds its reservation until then); returned in UTC."""
    if v is None:
        return None
    now = datetime.now(UTC)
    if v < now:
        raise ValueError("must not be in the past")
    if v > now + timedelta(days=MAX_RUN_AT_DAYS):
        raise ValueError(f"must be at most {MAX_RUN_AT_DAYS} days ahead")
    return v.astimezone(UTC)


class OffpeakDeadline(Camel):
    """An off-peak job's deadline and what it does there (engine/tiers.py)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    at: AwareDatetime | None = None
    then: OffpeakOnDeadline = "fail"

    _rfc3339 = field_validator("at", mode="before")(rfc3339_text)
    _ahead = field_validator("at")(within_run_at_days)


class CreateJobBody(Camel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    job_type: str = Field(min_length=1, max_length=64)
    target_type: str = Field(min_length=1, max_length=64)
    target_id: str = Field(min_length=1, max_length=128)
    input: dict[str, Any] = Field(default_factory=dict)
    # Strict: `true` or "5" is not a priority (lax mode would take them as 1 and 5).
    priority: int | None = Field(default=None, ge=0, le=100, strict=True)
    credential_mode: CredentialMode | None = None
    # One of the caller's own active keys, with credentialMode user_deepseek_key only; left
    # out: the newest. Anyone else's, a revoked or an unknown one: 404 CREDENTIAL_NOT_FOUND.
    credential_id: uuid.UUID | None = None
    # The most the job may cost in all, in USD (a number or a decimal string); its answer budget
    # is cut to fit, and a cap too low for its prompt is refused (422 COST_CAP_TOO_LOW).
    max_cost_usd: Decimal | None = Field(
        default=None, gt=0, le=1_000_000, max_digits=18, decimal_places=8, allow_inf_nan=False
    )
    metadata: Metadata = Field(
        default_factory=dict,
        max_length=MAX_METADATA_KEYS,
        description="Your own references, stored with the job and returned by every view of "
        f"it: at most {MAX_METADATA_KEYS} keys of 1-{MAX_METADATA_KEY_LENGTH} characters "
        f"`[A-Za-z0-9_.-]`, string values of at most {MAX_METADATA_VALUE_LENGTH} characters. "
        "Never sent to the AI provider. List your jobs by it with `metadata.<key>=<value>`.",
        examples=[{"courseId": "C42", "requestedBy": "teacher-7"}],
        json_schema_extra=metadata_schema,
    )
    run_at: AwareDatetime | None = Field(
        default=None,
        description="Run the job later: RFC 3339 with an offset (`Z` or `+01:00`), not in the "
        f"past, at most {MAX_RUN_AT_DAYS} days ahead and at least one hour before the job's "
        "input expires (create + DATA_RETENTION_DAYS; a later one is 422 at "
        '`["body", "runAt"]`). The job stays `queued` until then (its cost is reserved from '
        "the create) and may be cancelled meanwhile.",
    )
    prompt_version: str | None = Field(
        default=None,
        min_length=1,
        max_length=VERSION_MAX_LENGTH,
        description="Pin one of the job type's published prompt versions (`promptVersions` of "
        "GET /api/ai/job-types; left out: its default `promptVersion`). The job builds its "
        "prompt with exactly it on every attempt; any other value is refused (422).",
    )
    output_schema_version: str | None = Field(
        default=None,
        min_length=1,
        max_length=VERSION_MAX_LENGTH,
        description="Pin one of the job type's published output schema versions "
        "(`outputSchemaVersions` of GET /api/ai/job-types; left out: its default "
        "`outputSchemaVersion`); any other value is refused (422).",
    )

    service_tier: ServiceTier | None = Field(
        default=None,
        description="How soon and at which price the job's provider calls are made: `standard` "
        "(at once), `batch` (grouped into the provider's batch API, answered within 24 h at its "
        "batch price; for job types and providers that have it) or `offpeak` (held `queued` "
        "until the provider's next discount window, run there at its price). Left out: the "
        "job type's default (`defaultServiceTier` of GET /api/ai/job-types). A tier the job type "
        "or the provider does not offer is refused (422), never silently run on another.",
        examples=["standard"],
    )
    reuse: Literal["allow", "deny"] = Field(
        default="deny",
        description="`allow`: if you already have a succeeded job of this type with the same "
        "input, prompt version, model and output schema version (within its retention), this "
        "job copies its answer: no provider call, cost 0, `reusedFromJobId` set. Never across "
        "users. Only for job types that permit reuse (422 otherwise).",
    )
    tags: Tags = Field(default_factory=list)
    offpeak_deadline: OffpeakDeadline | None = Field(
        default=None,
        description='With `serviceTier: "offpeak"` only: `{"at": RFC 3339, "then": "standard" '
        '| "fail"}`. A job still waiting for a discount window at `at` (left out: '
        "24 hours after the create, the longest it may be) runs at once at the standard price when "
        '`then` is "standard", or fails with OFFPEAK_DEADLINE_PASSED when it is "fail" (the '
        'default). A bare "standard" or "fail" is short for `{"then": ...}`.',
    )

    concurrency: ConcurrencyBody | None = Field(default=None, description=CONCURRENCY_DOC)
    ttl_seconds: int | None = Field(
        default=None,
        ge=0,
        le=TTL_S_MAX,
        strict=True,
        description="Start-by TTL: the job must start within this many seconds of its create "
        "(of `runAt` for a delayed job), whatever it waits for, or it ends `cancelled` with "
        "`JOB_EXPIRED`, without a call and at no cost. `0` turns off any default; left out: "
        "the job type's `ttlSeconds`, else AI_DEFAULT_TTL_S (0: none).",
        examples=[600],
    )
    deadline: AwareDatetime | None = Field(
        default=None,
        description="The whole job's deadline (RFC 3339 with an offset, in the future, at most "
        f"{MAX_RUN_AT_DAYS} days ahead): past it the job stops wherever it is (a call in flight "
        "is cancelled and charged) and ends `cancelled` with `JOB_DEADLINE_EXCEEDED`.",
    )

    @field_validator("offpeak_deadline", mode="before")
    @classmethod
    def _deadline_shorthand(cls, v: Any) -> Any:
        return {"then": v} if isinstance(v, str) else v

    @field_validator(
        "job_type", "target_type", "target_id", "prompt_version", "output_schema_version"
    )
    @classmethod
    def _storable_str(cls, v: str | None) -> str | None:
        return storable_str(v) if v is not None else None

    _rfc3339 = field_validator("run_at", "deadline", mode="before")(rfc3339_text)
    _soon_enough = field_validator("run_at", "deadline")(within_run_at_days)

    @field_validator("input")
    @classmethod
    def _storable_input(cls, v: dict[str, Any]) -> dict[str, Any]:
        return storable_input(v)


def encode_cursor(key: JobKey | None) -> str | None:
    """The opaque cursor of a job page's `next_after` (None: no next page)."""
    if key is None:
        return None
    created_at, job_id = key
    return cursors.encode(f"{created_at.isoformat()}|{job_id}")


def decode_cursor(cursor: str | None) -> JobKey | None:
    if not cursor:
        return None
    created, _, job_id = cursors.decode(cursor).partition("|")
    try:
        return datetime.fromisoformat(created), uuid.UUID(job_id)
    except ValueError:
        raise cursors.invalid() from None


# ---- artifacts --------------------------------------------------------------------------

_ARTIFACT_CURSOR_PREFIX = "art:"


class ArtifactPage(Camel):
    items: list[ArtifactItem]
    next_cursor: str | None = None


def encode_artifact_cursor(key: ArtifactKey | None) -> str | None:
    """The opaque cursor of an artifact page's `next_after` (None: no next page)."""
    if key is None:
        return None
    return cursors.encode_ints(_ARTIFACT_CURSOR_PREFIX, *key)


def decode_artifact_cursor(cursor: str | None) -> ArtifactKey | None:
    """(ordinal, ai_job_artifact.id) of the last artifact of the previous page."""
    values = cursors.decode_ints(
        cursor, _ARTIFACT_CURSOR_PREFIX, (cursors.INT32_MAX, cursors.INT64_MAX)
    )
    return (values[0], values[1]) if values else None


# ---- admin: the outbox and stuck jobs ---------------------------------------------------

OutboxStatus = Literal["pending", "processing", "published", "failed", "dead"]
# outbox_event.event_type is varchar(64); a filter that cannot match is a 422.
EVENT_TYPE_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"
StuckReason = Literal[
    "DEAD_ENQUEUE",
    "ENQUEUE_BACKING_OFF",
    "WORKFLOW_TASK_FAILING",
    "WORKFLOW_MISSING",
    "WORKFLOW_CLOSED",
]


class OutboxEventOut(Camel):
    """An outbox row without its payload: of the payload only `jobId` is shown."""

    id: int
    event_type: str
    aggregate_id: str
    status: OutboxStatus
    attempt_count: int
    available_at: datetime
    locked_by: str | None = None
    last_error: str | None = Field(default=None, description="Truncated to 500 characters.")
    published_at: datetime | None = None
    created_at: datetime
    job_id: str | None = None


class OutboxPage(Camel):
    items: list[OutboxEventOut]
    next_cursor: str | None = None


class StuckOut(Camel):
    reason: StuckReason
    detail: str
    since: datetime | None = None


class AdminJobDetailResponse(AdminJobResponse):
    stuck: StuckOut | None = Field(
        default=None,
        description="Why a queued or running job is not progressing; null when nothing is wrong.",
    )
