"""`ai_rollout` and `ai_rollout_arm`: a job type's weighted rollout, and its figures per arm.

A PUT replaces the rollout whole (a new `id`: the figures, counted by that id, start anew); a
DELETE ends it. Both NOTIFY `ai_rollout_changed` with the job type, as the guard's halt does
(migration 0038 `ai_rollout_guard`), so every process's cache of rollouts (jobs/rollouts.py
`RolloutBook`) reads it again. The figures count the jobs created on each arm since the PUT
(`ai_job.rollout_id`/`rollout_arm`, index `ix_ai_job_rollout`) and their feedback, as committed
when they are read. Every function runs in the caller's transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

CHANNEL = "ai_rollout_changed"


@dataclass(frozen=True)
class ArmRow:
    name: str
    position: int
    prompt_version: str | None
    model: str | None
    weight: int
    state: str = "active"
    halted_reason: str | None = None


@dataclass(frozen=True)
class RolloutRow:
    job_type: str
    id: uuid.UUID
    min_samples: int
    min_mean_feedback: Decimal
    min_success_rate: Decimal
    updated_at: datetime
    arms: tuple[ArmRow, ...]


@dataclass(frozen=True)
class ArmFigures:
    jobs: int = 0
    succeeded: int = 0
    failed: int = 0
    ended: int = 0
    cost_usd: Decimal = Decimal(0)  # over the ended jobs
    feedback_count: int = 0
    feedback_sum: Decimal = Decimal(0)


_GET = text(
    "SELECT job_type, id, min_samples, min_mean_feedback, min_success_rate, updated_at "
    "FROM ai_rollout WHERE job_type = :t"
)
_ARMS = text(
    "SELECT name, position, prompt_version, model, weight, state, halted_reason "
    "FROM ai_rollout_arm WHERE rollout_id = :id ORDER BY position"
)
_DELETE = text(
    "WITH gone AS (DELETE FROM ai_rollout WHERE job_type = :t RETURNING job_type) "
    "SELECT count(*) AS n, pg_notify('ai_rollout_changed', :t) IS NULL AS notified FROM gone"
)
_INSERT = text(
    "INSERT INTO ai_rollout (job_type, id, min_samples, min_mean_feedback, min_success_rate, "
    "updated_at) VALUES (:t, :id, :n, :mf, :ms, now()) RETURNING updated_at"
)
_INSERT_ARM = text(
    "INSERT INTO ai_rollout_arm (rollout_id, name, position, prompt_version, model, weight) "
    "VALUES (:id, :name, :position, :prompt_version, :model, :weight)"
)
_NOTIFY = text("SELECT pg_notify('ai_rollout_changed', :t)")
_JOB_FIGURES = text(
    """
    SELECT rollout_arm AS arm, count(*) AS jobs,
           count(*) FILTER (WHERE lifecycle_status = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE lifecycle_status = 'failed') AS failed,
           count(*) FILTER (WHERE lifecycle_status IN ('succeeded', 'failed', 'cancelled'))
               AS ended,
           coalesce(sum(spent_cost_usd) FILTER (
               WHERE lifecycle_status IN ('succeeded', 'failed', 'cancelled')), 0) AS cost
    FROM ai_job WHERE rollout_id = :id GROUP BY rollout_arm
    """
)
_FEEDBACK_FIGURES = text(
    "SELECT rollout_arm AS arm, count(*) AS n, coalesce(sum(score), 0) AS total "
    "FROM ai_job_feedback WHERE rollout_id = :id GROUP BY rollout_arm"
)


async def get(s: AsyncSession, job_type: str) -> RolloutRow | None:
    """The job type's rollout and its arms (in their order), or None."""
    r = (await s.execute(_GET, {"t": job_type})).first()
    if r is None:
        return None
    arms = tuple(ArmRow(**a._mapping) for a in await s.execute(_ARMS, {"id": r.id}))
    return RolloutRow(
        r.job_type, r.id, r.min_samples, r.min_mean_feedback, r.min_success_rate, r.updated_at, arms
    )


async def replace(
    s: AsyncSession,
    job_type: str,
    arms: Sequence[ArmRow],
    *,
    min_samples: int,
    min_mean_feedback: Decimal,
    min_success_rate: Decimal,
) -> RolloutRow:
    """The job type's rollout replaced by a new one (a new id, every arm active)."""
    await s.execute(_DELETE, {"t": job_type})
    rollout_id = uuid.uuid4()
    params = {"t": job_type, "id": rollout_id, "n": min_samples}
    updated_at = (
        await s.execute(_INSERT, {**params, "mf": min_mean_feedback, "ms": min_success_rate})
    ).scalar_one()
    await s.execute(
        _INSERT_ARM,
        [
            {
                "id": rollout_id,
                "name": a.name,
                "position": n,
                "prompt_version": a.prompt_version,
                "model": a.model,
                "weight": a.weight,
            }
            for n, a in enumerate(arms)
        ],
    )
    await s.execute(_NOTIFY, {"t": job_type})
    placed = tuple(
        ArmRow(a.name, n, a.prompt_version, a.model, a.weight) for n, a in enumerate(arms)
    )
    return RolloutRow(
        job_type, rollout_id, min_samples, min_mean_feedback, min_success_rate, updated_at, placed
    )


async def delete(s: AsyncSession, job_type: str) -> bool:
    """End the job type's rollout; False when it had none."""
    row = (await s.execute(_DELETE, {"t": job_type})).one()
    return int(row.n) > 0


async def figures(s: AsyncSession, rollout_id: uuid.UUID) -> dict[str, ArmFigures]:
    """Each arm's jobs, endings, cost of its ended jobs and feedback (arms without any are
    left out)."""
    out: dict[str, ArmFigures] = {}
    for r in await s.execute(_JOB_FIGURES, {"id": rollout_id}):
        out[r.arm] = ArmFigures(r.jobs, r.succeeded, r.failed, r.ended, Decimal(r.cost))
    for r in await s.execute(_FEEDBACK_FIGURES, {"id": rollout_id}):
        base = out.get(r.arm, ArmFigures())
        out[r.arm] = ArmFigures(
            base.jobs, base.succeeded, base.failed, base.ended, base.cost_usd, r.n, r.total
        )
    return out
