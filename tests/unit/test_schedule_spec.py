"""The pure part of a schedule (engine/schedules.py): what is accepted, and the next fire that
`nextRunAt` shows before Temporal knows the schedule (epoch-aligned intervals, cron in a zone)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine.schedules import (
    InvalidSpec,
    Spec,
    check_spec,
    idempotency_key,
    next_fire,
    temporal_schedule_id,
)

NOW = datetime(2026, 12, 4, 21, 0, 1, 500, tzinfo=UTC)


@pytest.mark.parametrize(
    "spec",
    [
        Spec(None, "61 * * * *"),
        Spec(None, "* * *"),
        Spec(None, "@daily"),
        Spec(None, "0 0 L * *"),
        Spec(None, "0 0 * * 7"),
        Spec(None, "0 0 30 2 *"),
        Spec(None, "0 * * * *", "Mars/Olympus"),
        Spec(1, None),
        Spec(60, "0 * * * *"),
        Spec(None, None),
        Spec(60, None, start_at=NOW, end_at=NOW),
    ],
)
def test_invalid_specs_are_refused(spec: Spec) -> None:
    with pytest.raises(InvalidSpec):
        check_spec(spec, min_interval_s=2)


def test_an_interval_fires_on_the_epoch_grid_after_now() -> None:
    assert next_fire(Spec(2, None), NOW) == datetime(2026, 12, 4, 21, 0, 2, tzinfo=UTC)
    assert next_fire(Spec(3600, None), NOW) == datetime(2026, 12, 4, 22, tzinfo=UTC)


def test_cron_is_read_in_its_time_zone() -> None:
    spec = check_spec(Spec(None, "0  9 * * MON-FRI", "Europe/Paris"), min_interval_s=1)
    assert spec.cron == "0 9 * * MON-FRI"
    # Friday 4 December 2026, 22:00 in Paris: the next is Monday 09:00 Paris = 08:00 UTC.
    assert next_fire(spec, NOW) == datetime(2026, 12, 7, 8, tzinfo=UTC)


def test_the_window_bounds_the_next_fire() -> None:
    later = NOW + timedelta(days=1)
    assert next_fire(Spec(60, None, start_at=later), NOW) == later.replace(
        second=0, microsecond=0
    ) + timedelta(minutes=1)
    assert next_fire(Spec(3600, None, end_at=NOW + timedelta(minutes=5)), NOW) is None


def test_ids_name_the_schedule_and_the_time() -> None:
    assert "abc" in temporal_schedule_id("abc", "-t1")
    key = idempotency_key("abc", datetime(2026, 1, 1, tzinfo=UTC))
    assert key == "schedule:abc:2026-01-01T00:00:00Z"
