"""Which arm of a rollout a user gets: stable per user, split by weight, a halted arm's users
spread over the active ones while the others stay where they were."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from db.rollouts import ArmRow, RolloutRow
from engine.errors import ValidationFailed
from jobs.rollouts import bucket, checked_arms, choose

TYPE = "flashcard_generation"


def _rollout(*arms: tuple[str, int], halted: tuple[str, ...] = ()) -> RolloutRow:
    rows = tuple(
        ArmRow(name, n, None, "m", weight, "halted" if name in halted else "active")
        for n, (name, weight) in enumerate(arms)
    )
    return RolloutRow(TYPE, uuid.uuid4(), 4, Decimal(0), Decimal("0.5"), datetime.now(UTC), rows)


USERS = [f"user-{i}" for i in range(360)]


def test_360_users_split_90_10_within_6_points_and_keep_their_arm() -> None:
    r = _rollout(("stable", 90), ("canary", 10))
    arms = [choose(r, TYPE, u).name for u in USERS]
    share = arms.count("canary") / len(USERS)
    assert 0.04 <= share <= 0.16
    assert arms == [choose(r, TYPE, u).name for u in USERS]  # the same every time
    # Another rollout id (a PUT again) with the same arms splits the same users the same way.
    again = dataclasses.replace(r, id=uuid.uuid4())
    assert arms == [choose(again, TYPE, u).name for u in USERS]


def test_a_halted_arm_sends_its_users_to_the_active_ones_and_moves_nobody_else() -> None:
    r = _rollout(("a", 50), ("b", 40), ("c", 10))
    before = {u: choose(r, TYPE, u).name for u in USERS}
    halted = _rollout(("a", 50), ("b", 40), ("c", 10), halted=("b",))
    after = {u: choose(halted, TYPE, u).name for u in USERS}
    assert all(after[u] == before[u] for u in USERS if before[u] != "b")
    moved = [after[u] for u in USERS if before[u] == "b"]
    assert set(moved) == {"a", "c"} and moved.count("a") > moved.count("c")


def test_the_bucket_is_sha256_of_type_and_user() -> None:
    assert bucket(f"{TYPE}:u1") == bucket(f"{TYPE}:u1")
    assert 0 <= bucket("x") < 10_000
    assert len({bucket(f"{TYPE}:{u}") for u in USERS}) > 300


@pytest.mark.parametrize(
    ("arms", "where"),
    [
        ([("a", 60), ("b", 30)], ["body", "arms"]),
        ([("a", 50), ("a", 50)], ["body", "arms", "1", "name"]),
    ],
)
def test_the_arms_are_checked(arms: list[tuple[str, int]], where: list[object]) -> None:
    rows = [ArmRow(n, i, "v1", None, w) for i, (n, w) in enumerate(arms)]
    with pytest.raises(ValidationFailed) as refused:
        checked_arms(rows, prompt_versions=("v1",), models=("m",))
    assert refused.value.errors[0]["loc"] == where
