"""Flow control on the wire: a create's `concurrency` member (docs/api.md "Flow control") and
the operator pauses' bodies and answers (docs/admin.md "Operator pauses")."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from engine import flow
from engine.definition import JOB_TYPE_PATTERN
from jobs.views import Camel


def _storable(v: str) -> str:
    """Text PostgreSQL can store: no NUL, no unpaired surrogate."""
    if "\x00" in v:
        raise ValueError("must not contain NUL characters")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must not contain unpaired surrogates") from None
    return v


# Visible characters: no whitespace or control character.
KEY_PATTERN = r"^[^\s\x00-\x1f\x7f-\x9f]+$"
ConcurrencyKey = Annotated[
    str,
    StringConstraints(min_length=1, max_length=flow.KEY_MAX_LENGTH, pattern=KEY_PATTERN),
    AfterValidator(_storable),
]
_KEY_DOC = (
    "Your key: 1-200 visible characters. Keys are yours (another user's jobs never meet yours "
    "on a key) and shared by every job type. A job is active on its key while `queued` or "
    "`running`."
)


class _Concurrency(Camel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    key: ConcurrencyKey = Field(description=_KEY_DOC, examples=["notes-42"])


class SupersedeConcurrency(_Concurrency):
    """The latest create wins: every older active job of yours with the key ends `cancelled`
    with `SUPERSEDED` (a running one as a cancel ends it)."""

    mode: Literal["supersede"]


class SkipConcurrency(_Concurrency):
    """While one of your jobs holds the key, a create makes nothing and answers 200 with it."""

    mode: Literal["skip"]


class DebounceConcurrency(_Concurrency):
    """The job starts no sooner than `delayMs` after its create; a later debounce create with
    the key replaces it while it is still queued (the last one's input runs), but the chain
    waits no longer than its first create plus that create's `maxDelayMs`."""

    mode: Literal["debounce"]
    delay_ms: int = Field(
        ge=flow.DELAY_MS_MIN,
        le=flow.DELAY_MS_MAX,
        strict=True,
        description="Milliseconds from the create before the job may start (100..3600000)",
        examples=[4000],
    )
    max_delay_ms: int | None = Field(
        default=None,
        ge=flow.DELAY_MS_MIN,
        le=flow.MAX_DELAY_MS_MAX,
        strict=True,
        description="The longest a chain of debounced creates waits, from its first create "
        "(`delayMs`..86400000); left out: AI_DEBOUNCE_MAX_DELAY_MS (600000)",
    )

    @field_validator("max_delay_ms")
    @classmethod
    def _not_below_the_delay(cls, v: int | None, info: ValidationInfo) -> int | None:
        delay = info.data.get("delay_ms")
        if v is not None and isinstance(delay, int) and v < delay:
            raise ValueError("must not be below delayMs")
        return v


ConcurrencyBody = Annotated[
    SupersedeConcurrency | SkipConcurrency | DebounceConcurrency,
    Field(discriminator="mode"),
]
CONCURRENCY_DOC = (
    "Keyed concurrency: `{key, mode}`, `mode` one of `supersede` (the latest create wins: "
    "your older active jobs with the key end `cancelled`, `SUPERSEDED`), `skip` (while one of "
    "your jobs holds the key, answer 200 with it and make nothing) or `debounce` (with "
    "`delayMs`, and optionally `maxDelayMs`: start no sooner than `delayMs` after the create; "
    "a newer debounce create with the key replaces a job still queued). An Idempotency-Key "
    "replay is decided first. See docs/api.md, Flow control."
)


def concurrency_of(body: Any) -> flow.Concurrency | None:
    """A create body's `concurrency` as the engine's value (None: none given)."""
    if body is None:
        return None
    return flow.Concurrency(
        key=body.key,
        mode=body.mode,
        delay_ms=getattr(body, "delay_ms", None),
        max_delay_ms=getattr(body, "max_delay_ms", None),
    )


# ---- operator pauses --------------------------------------------------------------------------

_Text = Annotated[str, AfterValidator(_storable)]


class PauseMatchBody(Camel):
    """Which jobs a pause holds: at least one member; a job matches when every given member
    equals the job's (`model`: the model of the call about to be sent)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    job_type: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=JOB_TYPE_PATTERN.pattern,
        description="A job type the engine knows (GET /api/ai/job-types)",
        examples=["flashcard_generation"],
    )
    provider: _Text | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="The provider's name as docs/limits.md names it (`deepseek`, "
        "`openai_compatible`, ...)",
    )
    model: _Text | None = Field(
        default=None, min_length=1, max_length=200, description="The model of the call"
    )
    user_id: _Text | None = Field(
        default=None, min_length=1, max_length=128, description="The jobs of one user"
    )

    @model_validator(mode="after")
    def _matches_something(self) -> PauseMatchBody:
        if not any((self.job_type, self.provider, self.model, self.user_id)):
            raise ValueError("give at least one of jobType, provider, model, userId")
        return self


def _future(v: datetime | None) -> datetime | None:
    if v is not None and v <= datetime.now(UTC):
        raise ValueError("must be in the future")
    return v.astimezone(UTC) if v is not None else None


def _rfc3339(v: Any) -> Any:
    if v is not None and not isinstance(v, str):
        raise ValueError("must be an RFC 3339 date-time with an offset")
    return v


class PauseBody(Camel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    match: PauseMatchBody
    reason: _Text = Field(
        min_length=1,
        max_length=500,
        description="Why (shown in the list and the audit log)",
        examples=["a bad prompt: flashcards repeat the question"],
    )
    expires_at: AwareDatetime | None = Field(
        default=None,
        description="When the pause ends by itself (RFC 3339 with an offset, in the future); "
        "left out: until it is deleted",
    )

    _text = field_validator("expires_at", mode="before")(_rfc3339)
    _ahead = field_validator("expires_at")(_future)


class PauseMatchOut(Camel):
    job_type: str | None = None
    provider: str | None = None
    model: str | None = None
    user_id: str | None = None


class PauseOut(Camel):
    pause_id: uuid.UUID
    match: PauseMatchOut
    reason: str
    expires_at: datetime | None = None
    created_at: datetime
    created_by: str = Field(description="The admin who created it")


class PauseList(Camel):
    items: list[PauseOut]
