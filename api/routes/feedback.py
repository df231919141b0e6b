"""`POST /api/ai/jobs/{jobId}/feedback`: the owner's score of a succeeded job (jobs/feedback.py)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from fastapi import APIRouter, Response
from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from api.deps import JobId, State, User
from api.errors import PROBLEM
from api.schemas import WholeNumber, storable_text
from jobs import feedback
from jobs.view_models import Camel

router = APIRouter(prefix="/api/ai/jobs", tags=["jobs"])
MAX_COMMENT = 2000


class FeedbackIn(Camel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    score: float = Field(ge=-1, le=1, allow_inf_nan=False, description="-1 (bad) .. 1 (good)")
    item_ordinal: WholeNumber | None = Field(
        default=None, ge=0, le=2_147_483_647, description="The artifact the feedback is about"
    )
    comment: str | None = Field(default=None, max_length=MAX_COMMENT)

    @model_validator(mode="before")
    @classmethod
    def _a_number_is_not_a_boolean(cls, data: object) -> object:
        if isinstance(data, dict) and isinstance(data.get("score"), bool | str):
            raise ValueError("score must be a number")
        return data

    @field_validator("comment")
    @classmethod
    def _storable(cls, v: str | None) -> str | None:
        if v is not None and not storable_text(v):
            raise ValueError("comment must be text without NUL")
        return v


class FeedbackOut(Camel):
    job_id: str
    score: float
    item_ordinal: int | None = None
    comment: str | None = None
    rollout_arm: str | None = Field(default=None, description="The job's rollout arm")
    prompt_version: str
    model: str | None = Field(default=None, description="The model that answered the job")
    created_at: datetime
    updated_at: datetime


def _problem(description: str) -> dict[str, object]:
    return {
        "description": description,
        "content": {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }


@router.post(
    "/{jobId}/feedback",
    status_code=201,
    response_model=FeedbackOut,
    responses={
        200: {"model": FeedbackOut, "description": "It replaced your earlier feedback"},
        404: _problem("No such job of yours (`JOB_NOT_FOUND`)"),
        409: _problem("The job has not succeeded (`JOB_NOT_SUCCEEDED`)"),
    },
    summary="Give feedback on one of your succeeded jobs",
    description=(
        "A score from -1 to 1, optionally about one artifact (`itemOrdinal`) and with a "
        "comment (at most 2000 characters, private: the job's purge and retention clear it). "
        "One per job: 201 the first time, 200 when it replaces the earlier one. Stored with "
        "the job's rollout arm, prompt version and model: a rollout's guard may halt an arm "
        "on it."
    ),
)
async def give_feedback(
    job_id: JobId, body: FeedbackIn, state: State, principal: User, response: Response
) -> FeedbackOut:
    stored = await feedback.give(
        state.sessionmaker,
        job_id,
        principal.user_id,
        score=Decimal(str(body.score)),
        item_ordinal=body.item_ordinal,
        comment=body.comment,
    )
    response.status_code = 201 if stored.created else 200
    return FeedbackOut(
        job_id=str(stored.job_id),
        score=float(stored.score),
        item_ordinal=stored.item_ordinal,
        comment=stored.comment,
        rollout_arm=stored.rollout_arm,
        prompt_version=stored.prompt_version,
        model=stored.model,
        created_at=stored.created_at,
        updated_at=stored.updated_at,
    )
