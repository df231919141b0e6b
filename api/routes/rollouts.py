"""SUPER_ADMIN's rollouts: `PUT`, `GET`, `DELETE /admin-api/ai/job-types/{jobType}/rollout`
(jobs/rollout_admin.py; how creates are split: jobs/rollouts.py)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Response, status
from pydantic import ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from api.deps import Admin, State
from api.schemas import JOB_TYPE_PATTERN, WholeNumber
from api.state import AppState
from db.rollouts import ArmRow
from engine.errors import UnknownJobType, ValidationFailed
from jobs import rollout_admin
from jobs.rollout_admin import RolloutView
from jobs.rollouts import DEFAULT_GUARD, Guard, arm_models
from jobs.spec import AnyJobType
from jobs.view_models import Camel, UsdAmount

router = APIRouter(prefix="/admin-api/ai/job-types", tags=["admin"])
ARM_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
JobTypePath = Annotated[
    str, Path(alias="jobType", pattern=JOB_TYPE_PATTERN, description="The job type's name")
]


class _Body(Camel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class ArmIn(_Body):
    name: str = Field(pattern=ARM_NAME_PATTERN, description="Unique within the rollout")
    prompt_version: str | None = Field(
        default=None, min_length=1, max_length=128, description="One of the type's listed"
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="AI_MODEL or an AI_FALLBACKS model, tried first",
    )
    weight: WholeNumber = Field(ge=0, le=100, description="The weights sum to 100")

    @model_validator(mode="after")
    def _names_something(self) -> ArmIn:
        if self.prompt_version is None and self.model is None:
            raise ValueError("an arm names a promptVersion, a model or both")
        return self


class GuardIn(_Body):
    min_samples: WholeNumber = Field(default=100, ge=1, le=1_000_000)
    min_mean_feedback: float = Field(default=0.0, ge=-1, le=1, allow_inf_nan=False)
    min_success_rate: float = Field(default=0.9, ge=0, le=1, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_not_booleans(cls, data: object) -> object:
        if isinstance(data, dict) and any(isinstance(v, bool) for v in data.values()):
            raise ValueError("the guard's members are numbers")
        return data


class RolloutIn(_Body):
    arms: list[ArmIn] = Field(min_length=1, max_length=20)
    guard: GuardIn = Field(default_factory=GuardIn)


class GuardOut(Camel):
    min_samples: int
    min_mean_feedback: float
    min_success_rate: float


class ArmOut(Camel):
    name: str
    prompt_version: str | None
    model: str | None
    weight: int
    state: Literal["active", "halted"]
    halted_reason: Literal["feedback", "success_rate"] | None = None
    jobs: int = Field(description="Jobs created on the arm since the rollout was put")
    succeeded: int
    failed: int
    feedback_count: int
    success_rate: float | None = Field(
        description="succeeded / (succeeded + failed); cancelled jobs do not count; null before any"
    )
    mean_feedback: float | None = Field(description="The mean score; null without feedback")
    mean_cost_usd: UsdAmount | None = Field(
        default=None, description="The mean cost of its ended jobs; null before any"
    )


class RolloutOut(Camel):
    job_type: str
    arms: list[ArmOut]
    guard: GuardOut
    updated_at: datetime


def _out(view: RolloutView) -> RolloutOut:
    r = view.rollout
    arms = []
    for arm in r.arms:
        f = view.of(arm)
        arms.append(
            ArmOut(
                name=arm.name,
                prompt_version=arm.prompt_version,
                model=arm.model,
                weight=arm.weight,
                state=arm.state,
                halted_reason=arm.halted_reason,
                jobs=f.jobs,
                succeeded=f.succeeded,
                failed=f.failed,
                feedback_count=f.feedback_count,
                success_rate=rollout_admin.success_rate(f),
                mean_feedback=rollout_admin.mean_feedback(f),
                mean_cost_usd=rollout_admin.mean_cost(f),
            )
        )
    guard = GuardOut(
        min_samples=r.min_samples,
        min_mean_feedback=float(r.min_mean_feedback),
        min_success_rate=float(r.min_success_rate),
    )
    return RolloutOut(job_type=r.job_type, arms=arms, guard=guard, updated_at=r.updated_at)


def _job_type(state: AppState, job_type: str) -> AnyJobType:
    try:
        return state.catalog.get(job_type)
    except UnknownJobType:
        msg = "no such job type"
        raise ValidationFailed(
            f"Unknown job type {job_type!r}.",
            errors=[{"loc": ["path", "jobType"], "msg": msg, "type": "enum"}],
        ) from None


@router.put(
    "/{jobType}/rollout",
    response_model=RolloutOut,
    summary="Put a weighted rollout of a job type's prompt versions and models",
    description=(
        "Replaces the job type's rollout (its figures start anew). Each arm has a unique "
        "`name`, an integer `weight` (the weights sum to 100) and a listed `promptVersion` "
        "and/or a `model` (AI_MODEL or an AI_FALLBACKS model, tried first). A user keeps one "
        "arm while the rollout stands. The guard halts an arm whose feedback mean or success "
        "rate falls under its floor after `minSamples` (never the last active arm). Anything "
        "else is 422 `VALIDATION_FAILED` and leaves the rollout unchanged."
    ),
)
async def put_rollout(
    job_type: JobTypePath, body: RolloutIn, state: State, admin: Admin
) -> RolloutOut:
    jt = _job_type(state, job_type)
    policy = state.jobs.creation.policy
    models = arm_models(policy.model, policy.fallback_models, jt)
    arms = [ArmRow(a.name, n, a.prompt_version, a.model, a.weight) for n, a in enumerate(body.arms)]
    g = body.guard
    guard = Guard(
        g.min_samples, Decimal(str(g.min_mean_feedback)), Decimal(str(g.min_success_rate))
    )
    view = await rollout_admin.put(
        state.sessionmaker, jt, arms, guard, models=models, actor=admin.user_id
    )
    state.jobs.creation.rollouts.on_notify(job_type)  # this process's creates see it at once
    return _out(view)


@router.get(
    "/{jobType}/rollout",
    response_model=RolloutOut,
    summary="A job type's rollout with each arm's figures",
    description=(
        "Each arm's `state` (`active` or `halted`, with `haltedReason`), the jobs created on "
        "it since the PUT, how many succeeded and failed, its feedback, `successRate`, "
        "`meanFeedback` and `meanCostUsd` (over its ended jobs), counting everything stored "
        "before the request. 404 `ROLLOUT_NOT_FOUND` without one."
    ),
)
async def get_rollout(job_type: JobTypePath, state: State, admin: Admin) -> RolloutOut:
    return _out(await rollout_admin.read(state.sessionmaker, job_type))


@router.delete(
    "/{jobType}/rollout",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="End a job type's rollout",
    description="Later creates run on the type's default again. 404 `ROLLOUT_NOT_FOUND` "
    "without one.",
)
async def delete_rollout(job_type: JobTypePath, state: State, admin: Admin) -> Response:
    await rollout_admin.end(state.sessionmaker, job_type, actor=admin.user_id)
    state.jobs.creation.rollouts.on_notify(job_type)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# The guard's defaults, as the PUT applies them (docs/api.md).
assert GuardIn().min_samples == DEFAULT_GUARD["min_samples"]
