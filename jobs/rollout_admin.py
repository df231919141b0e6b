"""The admin's side of a rollout (`/admin-api/ai/job-types/{jobType}/rollout`): put one (checked
against the job type's listed prompt versions and the deployment's models, replacing any
earlier one: its figures start anew), read it with each arm's figures, end it. A put and a
delete are audited in their own transaction (`rollout.put`, `rollout.delete`); the guard's
halts are audited by the guard itself (`rollout.arm_halted`, actor `system`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from db import rollouts as rollouts_db
from db.rollouts import ArmFigures, ArmRow, RolloutRow
from db.session import SessionMaker
from engine.errors import RolloutNotFound
from jobs.audit import AuditEntry, AuditLog
from jobs.rollouts import Guard, checked_arms
from jobs.spec import AnyJobType

ROLLOUT_PUT = "rollout.put"
ROLLOUT_DELETE = "rollout.delete"
ROLLOUT_ARM_HALTED = "rollout.arm_halted"
TARGET = "rollout"


@dataclass(frozen=True)
class RolloutView:
    """A rollout with each arm's figures (arms without a job or a feedback yet: zeros)."""

    rollout: RolloutRow
    figures: dict[str, ArmFigures] = field(default_factory=dict)

    def of(self, arm: ArmRow) -> ArmFigures:
        return self.figures.get(arm.name, ArmFigures())


async def put(
    sm: SessionMaker,
    jt: AnyJobType,
    arms: Sequence[ArmRow],
    guard: Guard,
    *,
    models: Sequence[str],
    actor: str,
) -> RolloutView:
    """The job type's rollout replaced by `arms` and `guard` (VALIDATION_FAILED, nothing
    changed, when an arm is not right: jobs/rollouts.py `checked_arms`)."""
    arms = checked_arms(arms, prompt_versions=jt.prompt_versions, models=models)
    async with sm.begin() as s:
        rollout = await rollouts_db.replace(
            s,
            jt.job_type,
            arms,
            min_samples=guard.min_samples,
            min_mean_feedback=guard.min_mean_feedback,
            min_success_rate=guard.min_success_rate,
        )
        entry = AuditEntry(actor, ROLLOUT_PUT, TARGET, jt.job_type)
        await AuditLog.write(
            s, entry, "ok", rolloutId=str(rollout.id), arms=[(a.name, a.weight) for a in arms]
        )
    return RolloutView(rollout)


async def read(sm: SessionMaker, job_type: str) -> RolloutView:
    """The job type's rollout and its figures as committed now (ROLLOUT_NOT_FOUND)."""
    async with sm() as s:
        rollout = await rollouts_db.get(s, job_type)
        if rollout is None:
            raise RolloutNotFound(f"The job type {job_type} has no rollout.")
        return RolloutView(rollout, await rollouts_db.figures(s, rollout.id))


async def end(sm: SessionMaker, job_type: str, *, actor: str) -> None:
    """End the job type's rollout (ROLLOUT_NOT_FOUND when it has none)."""
    async with sm.begin() as s:
        if not await rollouts_db.delete(s, job_type):
            raise RolloutNotFound(f"The job type {job_type} has no rollout.")
        await AuditLog.write(s, AuditEntry(actor, ROLLOUT_DELETE, TARGET, job_type), "ok")


def success_rate(f: ArmFigures) -> float | None:
    """succeeded / (succeeded + failed); None before any."""
    done = f.succeeded + f.failed
    return f.succeeded / done if done else None


def mean_feedback(f: ArmFigures) -> float | None:
    return float(f.feedback_sum / f.feedback_count) if f.feedback_count else None


def mean_cost(f: ArmFigures) -> Decimal | None:
    """Over the arm's ended jobs; None before any."""
    return f.cost_usd / f.ended if f.ended else None
