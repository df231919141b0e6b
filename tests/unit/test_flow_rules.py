"""Flow control's pure rules (engine/flow.py, jobs/flow.py, jobs/pauses.py): a debounced job's
due time and its chain's cap, the start-by time, which TTL a create gets, what a pause matches
and how long a held call waits, the view of `concurrency`, the fingerprint an Idempotency-Key
stands for, and when the relay wakes."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from activities.relay_flow import expiring, wake_in_s
from activities.relay_wake import Wake, WakeTimes
from db.pauses import InForce
from db.relay import Claimed
from engine import flow
from engine.flow import PAUSE_BACKSTOP_S, Concurrency, PauseMatch
from jobs import flow as jobs_flow
from jobs import pauses
from jobs.requests import CreateJobRequest
from jobs.waits import Wait

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def test_a_debounced_job_waits_its_delay_within_its_chains_cap() -> None:
    cap = flow.debounce_cap(T0, 10_000)
    assert flow.debounce_due(T0, None, 4000, cap) == T0 + timedelta(seconds=4)
    late = T0 + timedelta(seconds=8)
    assert flow.debounce_due(late, None, 4000, cap) == cap  # its own delay would pass the cap
    run_at = T0 + timedelta(minutes=5)
    assert flow.debounce_due(T0, run_at, 4000, T0 + timedelta(hours=1)) == run_at + timedelta(
        seconds=4
    )
    assert flow.debounce_due(T0, run_at, 4000, cap) == run_at  # never before its runAt


def test_the_start_by_time_counts_from_the_create_or_run_at() -> None:
    assert flow.start_by(T0, None, None) is None
    assert flow.start_by(T0, None, 30) == T0 + timedelta(seconds=30)
    run_at = T0 + timedelta(hours=1)
    assert flow.start_by(T0, run_at, 30) == run_at + timedelta(seconds=30)


def test_the_ttl_is_the_creates_else_the_types_else_the_setting() -> None:
    assert flow.effective_ttl(None, None, 0) is None
    assert flow.effective_ttl(None, None, 300) == 300
    assert flow.effective_ttl(None, 60, 300) == 60
    assert flow.effective_ttl(10, 60, 300) == 10
    assert flow.effective_ttl(0, 60, 300) is None  # 0 turns every default off


def test_a_pause_matches_when_every_given_member_equals_the_jobs() -> None:
    p = PauseMatch(job_type="quiz_generation", model="m1")
    assert p.matches("quiz_generation", "deepseek", "m1", "u1")
    assert not p.matches("quiz_generation", "deepseek", "m2", "u1")
    assert not p.matches("flashcard_generation", "deepseek", "m1", "u1")
    assert PauseMatch(user_id="u1").matches("any", "any", "any", "u1")


def test_a_held_call_waits_for_the_last_matching_pause_or_the_backstop() -> None:
    soon, later = T0 + timedelta(seconds=30), T0 + timedelta(seconds=90)
    both = (InForce(PauseMatch(user_id="u1"), soon), InForce(PauseMatch(model="m"), later))

    def held(ps: tuple[InForce, ...], user: str = "u1") -> Wait | None:
        return pauses.held(ps, job_type="t", provider="p", model="m", user_id=user, now=T0)

    wait = held(both)
    assert wait is not None and wait.reason == "operator_pause"
    assert 90 <= wait.wait_s <= 92 and wait.job_type == "t" and wait.user_id == "u1"
    forever = (InForce(PauseMatch(user_id="u1"), None),)
    backstop = held(forever)
    assert backstop is not None and backstop.wait_s == PAUSE_BACKSTOP_S
    assert held(forever, "u2") is None
    assert held(()) is None


def test_the_view_shows_every_member_and_null_for_those_not_given() -> None:
    given = Concurrency("k", "debounce", delay_ms=4000).given()
    assert given == {"key": "k", "mode": "debounce", "delayMs": 4000}
    assert flow.view(given) == {"key": "k", "mode": "debounce", "delayMs": 4000, "maxDelayMs": None}
    assert flow.view(None) is None


def test_the_flow_members_are_part_of_the_request_a_key_stands_for() -> None:
    base = CreateJobRequest("u", "synthetic", "t", "1", {})
    assert jobs_flow.fingerprint(base) == {}  # earlier fingerprints are unchanged
    variants = [
        CreateJobRequest("u", "synthetic", "t", "1", {}, concurrency=Concurrency("k", "skip")),
        CreateJobRequest("u", "synthetic", "t", "1", {}, concurrency=Concurrency("k", "supersede")),
        CreateJobRequest("u", "synthetic", "t", "1", {}, ttl_seconds=0),
        CreateJobRequest("u", "synthetic", "t", "1", {}, ttl_seconds=60),
        CreateJobRequest("u", "synthetic", "t", "1", {}, deadline=T0),
    ]
    prints = [tuple(sorted(jobs_flow.fingerprint(r).items())) for r in variants]
    assert len(set(prints)) == len(prints)


def test_the_relay_wakes_at_its_next_due_time_or_expiry() -> None:
    claim = Claimed([], holding=False)
    assert wake_in_s(claim) is None and not expiring(claim)
    wake = Wake(WakeTimes(poll_interval_s=30.0, job_wake_s=0.2))
    wake.claimed(100.0, False, wake_in_s(claim))
    assert wake.due(129.0, blocked=False) is None  # nothing due: the poll alone
    claim = dataclasses.replace(claim, due_in_s=4.0, expire_in_s=1.5)
    assert wake_in_s(claim) == 1.5
    wake.claimed(100.0, False, wake_in_s(claim))
    assert wake.due(101.4, blocked=False) is None
    assert wake.due(101.5, blocked=False) == "claim"
    claim = dataclasses.replace(claim, expire_in_s=-0.1)
    assert expiring(claim)
    wake.claimed(102.0, False, 0.0)  # expired some: again soon, never in a tight loop
    assert wake.due(102.1, blocked=False) is None
    assert wake.due(102.2, blocked=False) == "claim"
