"""When the relay claims, publishes or sleeps (activities/relay_wake.py): an outbox NOTIFY is
claimed at once after a quiet spell and never held back by a job change; a job change costs
nothing unless rows are held; a burst's claims are spaced; dispatched rows are marked by the
next claim or alone once their time comes; the poll and a failed row's retry are backstops."""

from __future__ import annotations

from activities.relay_wake import Wake, WakeTimes

T = WakeTimes(poll_interval_s=30.0, job_wake_s=0.2, claim_every_s=0.05, publish_within_s=0.1)


def quiet(now: float = 100.0, *, holding: bool = False) -> Wake:
    """A relay that claimed at `now` and has heard nothing since."""
    w = Wake(T)
    w.claimed(now, holding)
    return w


def test_an_outbox_notify_after_a_quiet_spell_is_claimed_at_once() -> None:
    w = quiet()
    assert w.due(101.0, blocked=False) is None
    w.on_outbox("")
    assert w.due(101.0, blocked=False) == "claim"


def test_claims_of_a_burst_are_spaced_and_none_is_lost() -> None:
    w = quiet(100.0)
    w.on_outbox("")
    assert w.due(100.03, blocked=False) is None  # within claim_every_s of the last claim
    assert w.due(100.05, blocked=False) == "claim"


def test_a_notify_heard_while_a_claim_was_in_flight_is_claimed_next() -> None:
    # Its row may have committed after the claim's snapshot: the claim did not see it.
    w = quiet(100.0)
    w.on_outbox("")
    heard = w.heard  # the claim begins
    w.on_outbox("")  # a create commits during its round trip
    w.claimed(100.1, False, None, heard)
    assert w.due(100.15, blocked=False) == "claim"  # not at the poll, 30 s later

    done = quiet(100.0)
    done.on_outbox("")
    done.claimed(100.1, False, None, done.heard)  # nothing heard during the claim
    assert done.due(100.15, blocked=False) is None


def test_a_job_change_while_a_claim_holding_rows_was_in_flight_is_kept() -> None:
    w = quiet(100.0, holding=True)
    heard = w.heard
    w.on_job_changed("5f0c7a6e-0000-4000-8000-000000000000")  # a job ends during the claim
    w.claimed(100.1, True, None, heard)
    assert w.due(100.2, blocked=False) is None  # at most every job_wake_s
    assert w.due(100.3, blocked=False) == "claim"


def test_a_job_change_costs_nothing_unless_rows_are_held() -> None:
    w = quiet(100.0, holding=False)
    w.on_job_changed("5f0c7a6e-0000-4000-8000-000000000000")
    assert not w.kick.is_set()
    assert w.due(105.0, blocked=False) is None

    held = quiet(100.0, holding=True)
    held.on_job_changed("5f0c7a6e-0000-4000-8000-000000000000")
    assert held.due(100.1, blocked=False) is None  # at most every job_wake_s
    assert held.due(100.2, blocked=False) == "claim"


def test_a_job_change_never_holds_an_outbox_notify_back() -> None:
    w = quiet(100.0, holding=True)
    w.on_job_changed("5f0c7a6e-0000-4000-8000-000000000000")
    w.on_outbox("")
    assert w.due(100.05, blocked=False) == "claim"  # not job_wake_s after the last claim


def test_missed_notifications_are_a_claim() -> None:
    w = quiet()
    w.on_job_changed(None)
    assert w.due(101.0, blocked=False) == "claim"


def test_full_slots_or_an_unreachable_temporal_hold_claims_until_they_end() -> None:
    w = quiet()
    w.on_outbox("")
    assert w.due(101.0, blocked=True) is None
    w.paused_until = 105.0
    assert w.due(101.0, blocked=False) is None
    assert w.due(105.0, blocked=False) == "claim"


def test_dispatched_rows_are_marked_by_the_next_claim_or_alone_when_due() -> None:
    w = quiet(100.0)
    w.publish_by(100.1)
    assert w.due(100.05, blocked=False) is None
    assert w.due(100.1, blocked=False) == "publish"
    w.on_outbox("")
    assert w.due(100.1, blocked=False) == "claim"  # the claim carries the marks


def test_the_poll_and_a_retry_are_backstops() -> None:
    w = quiet(100.0)
    assert w.due(129.0, blocked=False) is None
    assert w.due(130.0, blocked=False) == "claim"
    r = quiet(100.0)
    r.retry_at = 102.0
    assert r.due(101.0, blocked=False) is None
    assert r.due(102.0, blocked=False) == "claim"


def test_the_next_due_time_wakes_a_claim_never_in_a_tight_loop() -> None:
    w = Wake(T)
    w.claimed(100.0, False, due_in_s=5.0)  # a delayed job comes due in 5 s
    assert w.due(104.9, blocked=False) is None
    assert w._next_at(104.9, blocked=False) == 105.0
    assert w.due(105.0, blocked=False) == "claim"
    w.claimed(105.0, False, due_in_s=-1.0)  # overdue: another claim holds it
    assert w.due(105.1, blocked=False) is None
    assert w.due(105.2, blocked=False) == "claim"
    w.claimed(105.2, False, None)  # nothing waits for a time: the poll alone
    assert w.due(134.0, blocked=False) is None
