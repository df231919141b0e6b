"""Weighted rollouts of a job type's prompt versions and models, judged by outcomes and feedback.

A rollout (`PUT /admin-api/ai/job-types/{jobType}/rollout`) splits a job type's creates between
arms by weight; an arm names a listed prompt version and/or a model (AI_MODEL or an AI_FALLBACKS
model, tried first). Which arm a create gets (`choose`) is a pure function of the job type, the
user and the arms: SHA-256 of `jobType:userId` into 10,000 buckets, each arm a range of buckets
the width of its weight, in the arms' order. The same user gets the same arm in every process
and after restarts, as long as the rollout stands. An arm the guard halted keeps its range: its
users are spread over the active arms in proportion to their weights by a second hash (of the
user and the halted arm), so the other arms' users never move.

The arm is decided before the create's checks (the prompt version and the model change the
estimate and the reuse key) and recorded on the job (`rollout_id`, `rollout_arm`, `arm_model`);
a retry keeps its original's, a create pinning a version gets none. The current rollouts are
kept by `RolloutBook`, in memory while the process's one listener delivers
`ai_rollout_changed` (a PUT, a DELETE, a halt). Whether the book is right is checked by the
job's own INSERT, which returns the type's rollout id as it sees it (jobs/creation.py): a create
that chose from another view (or from none: a process without a listener reads nothing first)
is rolled back and made again with the rollout read afresh. A type without a rollout thus costs
its creates no statement.

The guard (halting an arm on its feedback or success rate) runs in PostgreSQL, in the
transaction that ends a job of the rollout or stores its feedback (migration 0038): no other job
pays for it.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from db import rollouts as rollouts_db
from db.jobs import JobRow
from db.rollouts import ArmRow, RolloutRow
from db.session import SessionMaker
from engine.errors import ValidationFailed
from jobs.spec import AnyJobType

BUCKETS = 10_000
CHANNEL = rollouts_db.CHANNEL
DEFAULT_GUARD = {"min_samples": 100, "min_mean_feedback": 0.0, "min_success_rate": 0.9}


@dataclass(frozen=True)
class ArmChoice:
    """What a job runs on in its arm: the rollout (its id at the create), the arm's name, its
    prompt version (None: the type's default) and its model (None: the configured one)."""

    rollout_id: uuid.UUID
    name: str
    prompt_version: str | None = None
    model: str | None = None

    @classmethod
    def of_job(cls, row: JobRow) -> ArmChoice | None:
        """The arm a job was created on (its retry keeps it)."""
        if row.rollout_id is None or row.rollout_arm is None:
            return None
        return cls(row.rollout_id, row.rollout_arm, row.prompt_version, row.arm_model)


def bucket(key: str) -> int:
    """A stable bucket of 0..9,999 for `key`."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % BUCKETS


def _by_weight(arms: Sequence[ArmRow], point: int, total: int) -> ArmRow:
    """The arm whose range of `total` weight units holds `point` (0 <= point < total)."""
    edge = 0
    for arm in arms:
        edge += arm.weight
        if point < edge:
            return arm
    return arms[-1]


def choose(rollout: RolloutRow, job_type: str, user_id: str) -> ArmRow:
    """The user's arm (module docstring)."""
    arms = rollout.arms
    first = _by_weight(arms, bucket(f"{job_type}:{user_id}") * 100 // BUCKETS, 100)
    if first.state == "active":
        return first
    active = [a for a in arms if a.state == "active"]
    total = sum(a.weight for a in active)
    if not active:
        return first
    if total <= 0:
        return active[0]
    point = bucket(f"{job_type}:{user_id}:{first.name}") * total // BUCKETS
    return _by_weight([a for a in active if a.weight > 0], point, total)


def choice(rollout: RolloutRow, job_type: str, user_id: str) -> ArmChoice:
    arm = choose(rollout, job_type, user_id)
    return ArmChoice(rollout.id, arm.name, arm.prompt_version, arm.model)


class RolloutBook:
    """The rollouts as creates read them. Without a listener (`listening` False) every read
    asks the database; with one, a job type's rollout (or its absence) is kept in memory until
    `on_notify` hears it changed. A read that overlapped a notification is not kept."""

    def __init__(self, sessionmaker: SessionMaker) -> None:
        self._sm = sessionmaker
        self._kept: dict[str, RolloutRow | None] = {}
        self._generation = 0
        self.listening = False

    def on_notify(self, payload: str | None) -> None:
        """The listener's handler of `ai_rollout_changed` (payload: the job type; None after a
        (re)connect: anything may have changed)."""
        self._generation += 1
        if payload is None:
            self._kept.clear()
        else:
            self._kept.pop(payload, None)

    async def current(self, job_type: str, *, fresh: bool = False) -> RolloutRow | None:
        """The job type's rollout: kept, or (`fresh`, or not kept) read."""
        if self.listening and not fresh and job_type in self._kept:
            return self._kept[job_type]
        generation = self._generation
        async with self._sm() as s:
            rollout = await rollouts_db.get(s, job_type)
        if self.listening and generation == self._generation:
            self._kept[job_type] = rollout
        return rollout


# ---- the PUT's checks ------------------------------------------------------------------------


@dataclass(frozen=True)
class Guard:
    min_samples: int
    min_mean_feedback: Decimal
    min_success_rate: Decimal


def _refused(msg: str, *loc: str | int) -> ValidationFailed:
    where = ["body", *(str(part) for part in loc)]  # every part a string, as the API's are
    return ValidationFailed(msg, errors=[{"loc": where, "msg": msg, "type": "value"}])


def checked_arms(
    arms: Sequence[ArmRow],
    *,
    prompt_versions: Sequence[str],
    models: Sequence[str],
) -> list[ArmRow]:
    """The arms of a PUT, or VALIDATION_FAILED naming the first arm that is not right: unique
    names, weights summing to 100, a listed prompt version and/or one of `models`."""
    seen: set[str] = set()
    for n, arm in enumerate(arms):
        if arm.name in seen:
            raise _refused(f"arm name {arm.name!r} is used twice", "arms", n, "name")
        seen.add(arm.name)
        if arm.prompt_version is None and arm.model is None:
            raise _refused("an arm names a promptVersion, a model or both", "arms", n)
        if arm.prompt_version is not None and arm.prompt_version not in prompt_versions:
            listed = ", ".join(prompt_versions)
            msg = f"promptVersion must be one of the job type's: {listed}"
            raise _refused(msg, "arms", n, "promptVersion")
        if arm.model is not None and arm.model not in models:
            msg = f"model must be one of: {', '.join(models)}"
            raise _refused(msg, "arms", n, "model")
    total = sum(a.weight for a in arms)
    if total != 100:
        raise _refused(f"the arms' weights sum to {total}, not 100", "arms")
    return list(arms)


def arm_models(configured: str, fallback_models: Sequence[str], jt: AnyJobType) -> list[str]:
    """The models an arm of this job type may name: AI_MODEL and the AI_FALLBACKS models."""
    del jt  # every type may try any entry first: its reservation covers the arm's model
    return [configured, *(m for m in fallback_models if m != configured)]
