"""Response and request models (JSON in camelCase). JobStatusResponse's shape is frozen: clients
depend on it (docs/api.md)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from api import cursors
from db.jobs import ArtifactRef, JobRow
from engine.definition import JOB_TYPE_PATTERN as _JOB_TYPE_RE
from engine.definition import CredentialMode, QueueName
from engine.lifecycle import StatusName

Status = StatusName
Queue = QueueName
# Deeper `input` documents fail pydantic's serializer (depth ~255) inside create: refuse them here.
MAX_INPUT_DEPTH = 64
# A job's `input` is kept (jsonb) and turned into provider prompts: bound it well below
# MAX_REQUEST_BYTES, measured as compact UTF-8 JSON (close to what the jsonb column holds).
MAX_INPUT_BYTES = 256 * 1024
# A query filter that PostgreSQL can compare: text columns cannot hold NUL (driver DataError).
NO_NUL = r"^[^\x00]*$"
# A jobType filter that no job type could match is a 422.
JOB_TYPE_PATTERN = _JOB_TYPE_RE.pattern


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


def compact_json_size(value: Any) -> int:
    """Bytes of `value` as compact UTF-8 JSON. Call it after `check_storable_json`: unpaired
    surrogates cannot be encoded, and that check refuses them with a clear message."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


class Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class ArtifactOut(Camel):
    artifact_type: str
    artifact_id: str


class ResultOut(Camel):
    artifact_count: int
    artifacts: list[ArtifactOut]


class JobStatusResponse(Camel):
    job_id: uuid.UUID
    job_type: str
    lifecycle_status: Status
    queue_name: str
    priority: int
    progress: int
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error_code: str | None = None
    public_error_message: str | None = None
    result: ResultOut | None = None


class CancelResponse(JobStatusResponse):
    cancel_outcome: Literal["cancelled", "cancel_requested"]


class AdminJobResponse(JobStatusResponse):
    user_id: str
    target_type: str
    target_id: str
    internal_error_message: str | None = None
    workflow_id: str
    temporal_ui_url: str
    attempt_count: int
    cancel_requested_at: datetime | None = None
    retried_from_job_id: uuid.UUID | None = None
    output_hash: str | None = None


class JobPage(Camel):
    items: list[JobStatusResponse]
    next_cursor: str | None = None


class AdminJobPage(Camel):
    items: list[AdminJobResponse]
    next_cursor: str | None = None


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

    @field_validator("job_type", "target_type", "target_id")
    @classmethod
    def _storable_str(cls, v: str) -> str:
        if not storable_text(v):
            raise ValueError("must not contain NUL characters or unpaired surrogates")
        return v

    @field_validator("input")
    @classmethod
    def _storable_input(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_storable_json(v)
        if compact_json_size(v) > MAX_INPUT_BYTES:
            # The message states the bound, never the value.
            raise ValueError(f"must not exceed {MAX_INPUT_BYTES} bytes as compact JSON")
        return v


def status_response(row: JobRow, artifacts: list[ArtifactRef]) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job_id": row.id,
        "job_type": row.job_type,
        "lifecycle_status": row.lifecycle_status,
        "queue_name": row.queue_name,
        "priority": row.priority,
        "progress": row.progress,
        "created_at": row.created_at,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
        "error_code": row.error_code,
        "public_error_message": row.public_error_message,
        "result": None,
    }
    if artifacts or row.lifecycle_status == "succeeded":
        data["result"] = ResultOut(
            artifact_count=len(artifacts),
            artifacts=[
                ArtifactOut(artifact_type=a.artifact_type, artifact_id=a.artifact_id)
                for a in artifacts
            ],
        )
    return data


def encode_cursor(row: JobRow) -> str:
    return cursors.encode(f"{row.created_at.isoformat()}|{row.id}")


def decode_cursor(cursor: str | None) -> tuple[datetime, uuid.UUID] | None:
    if not cursor:
        return None
    created, _, job_id = cursors.decode(cursor).partition("|")
    try:
        return datetime.fromisoformat(created), uuid.UUID(job_id)
    except ValueError:
        raise cursors.invalid() from None


# ---- artifacts --------------------------------------------------------------------------

_ARTIFACT_CURSOR_PREFIX = "art:"


class ArtifactItem(Camel):
    artifact_type: str
    artifact_id: str
    ordinal: int
    content: dict[str, Any] | None = Field(
        default=None,
        description="The projected business row as the job type exposes it (camelCase); null "
        "when the job type has no view or the row is gone.",
    )


class ArtifactPage(Camel):
    items: list[ArtifactItem]
    next_cursor: str | None = None


def encode_artifact_cursor(ordinal: int, row_id: int) -> str:
    return cursors.encode_ints(_ARTIFACT_CURSOR_PREFIX, ordinal, row_id)


def decode_artifact_cursor(cursor: str | None) -> tuple[int, int] | None:
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
