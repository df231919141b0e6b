"""PREPARE's reads for RESOLVE (activities/stage_handoff.py): taken once, only by the same run
and job, only while fresh; never more than the cap wait."""

from __future__ import annotations

import time
import uuid

import pytest

from activities.stage_handoff import MAX_AGE_S, MAX_WAITING, Handoff
from db.stage_reads import ResolveRead


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(time, "monotonic", c)  # the module reads time.monotonic at each call
    return c


def read() -> ResolveRead:
    return ResolveRead(refs=None, chunks=[])


def test_the_same_run_and_job_take_it_once(clock: Clock) -> None:
    h, job, r = Handoff(), uuid.uuid4(), read()
    h.put("run-1", job, r)
    assert h.take("run-1", job) is r
    assert h.take("run-1", job) is None  # once


def test_another_run_or_job_never_gets_it(clock: Clock) -> None:
    h, job = Handoff(), uuid.uuid4()
    h.put("run-1", job, read())
    assert h.take("run-2", job) is None
    assert h.take("run-1", uuid.uuid4()) is None  # and the mismatch used it up
    assert h.take("run-1", job) is None


def test_a_stale_one_is_read_again(clock: Clock) -> None:
    h, job = Handoff(), uuid.uuid4()
    h.put("run-1", job, read())
    clock.now += MAX_AGE_S + 0.01  # a run that slept between the two stages
    assert h.take("run-1", job) is None


def test_left_behind_ones_are_dropped_by_age_and_by_the_cap(clock: Clock) -> None:
    h = Handoff()
    h.put("old", uuid.uuid4(), read())
    clock.now += MAX_AGE_S + 0.01
    h.put("new", uuid.uuid4(), read())
    assert list(h._left) == ["new"]  # the stale one went with the next put
    for i in range(MAX_WAITING + 10):
        h.put(f"run-{i}", uuid.uuid4(), read())
    assert len(h._left) == MAX_WAITING
    assert "run-0" not in h._left and f"run-{MAX_WAITING + 9}" in h._left
