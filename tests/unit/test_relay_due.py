"""The relay and due times (activities/relay_due.py): it sleeps no longer than until the next due
time (never in a tight loop), passes a runAt to a workflow only while it is still ahead, and
counts a delayed job's lag from its start, not its create."""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime, timedelta

from activities.relay_due import lag_s, sleep_s, still_ahead
from db.outbox import OutboxRow


def test_the_sleep_ends_at_the_next_due_time_within_the_poll_interval() -> None:
    assert sleep_s(5.0, None, 0.2) == 5.0  # nothing due later: the poll
    assert 1.9 < sleep_s(5.0, time.monotonic() + 2.0, 0.2) <= 2.0
    assert sleep_s(5.0, time.monotonic() + 60.0, 0.2) == 5.0
    assert sleep_s(5.0, time.monotonic() - 3.0, 0.2) == 0.2  # overdue: soon, not in a loop


def test_a_run_at_goes_to_the_workflow_only_while_it_is_ahead() -> None:
    later = datetime.now(UTC) + timedelta(minutes=5)
    assert still_ahead(later.isoformat()) == later.isoformat()
    assert still_ahead((datetime.now(UTC) + timedelta(seconds=0.5)).isoformat()) == ""
    assert still_ahead((datetime.now(UTC) - timedelta(seconds=5)).isoformat()) == ""
    assert still_ahead(None) == still_ahead("") == still_ahead("not a time") == ""
    assert still_ahead("2099-01-01T00:00:00") == ""  # no offset: never guessed


def row(created: datetime, available: datetime, attempts: int) -> OutboxRow:
    return OutboxRow(
        id=1,
        event_type="ai.job.enqueue",
        aggregate_type="AiJob",
        aggregate_id="x",
        dedupe_key="k",
        payload={},
        status="processing",
        attempt_count=attempts,
        available_at=available,
        locked_by=None,
        locked_at=None,
        last_error=None,
        published_at=None,
        created_at=created,
    )


def test_a_delayed_jobs_lag_counts_from_its_start() -> None:
    now = datetime.now(UTC)
    delayed = row(now - timedelta(minutes=10), now - timedelta(seconds=1), attempts=1)
    assert 0.9 < lag_s(delayed) < 5
    plain = row(now - timedelta(seconds=3), now - timedelta(seconds=3), attempts=1)
    assert 2.9 < lag_s(plain) < 8
    retried = dataclasses.replace(delayed, attempt_count=3)  # its backoff counts as lag
    assert lag_s(retried) > 590
