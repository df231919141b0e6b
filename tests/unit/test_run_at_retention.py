"""A delayed job starts while its input lives: `runAt` at least one hour before create +
DATA_RETENTION_DAYS, else 422 at `["body", "runAt"]` naming the setting (create and quote share
the check, jobs/requests.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engine.errors import ValidationFailed
from jobs.policy import CreatePolicy
from jobs.requests import CreateJobRequest, RequestChecker
from jobs.types import default_catalog


def check(days: int, run_at: datetime | None) -> Any:
    req = CreateJobRequest(
        user_id="u1",
        job_type="synthetic",
        target_type="t",
        target_id="1",
        input={"echo": {"a": 1}},
        run_at=run_at,
    )
    return RequestChecker(default_catalog(), CreatePolicy(snapshot_ttl_days=days)).check(req)


@pytest.mark.parametrize(
    ("days", "ahead"),
    [
        (2, timedelta(days=3)),
        (2, timedelta(days=2) - timedelta(minutes=59)),
        (1, timedelta(hours=23, minutes=1)),
        (30, timedelta(days=30) - timedelta(minutes=30)),
    ],
)
def test_a_run_at_past_the_snapshot_s_life_is_refused_at_the_body_field(
    days: int, ahead: timedelta
) -> None:
    with pytest.raises(ValidationFailed) as info:
        check(days, datetime.now(UTC) + ahead)
    err = info.value
    assert err.code == "VALIDATION_FAILED"
    assert [e["loc"] for e in err.errors] == [["body", "runAt"]]
    assert "DATA_RETENTION_DAYS" in err.public_message
    assert "DATA_RETENTION_DAYS" in str(err.errors[0]["msg"])


@pytest.mark.parametrize(
    ("days", "ahead"),
    [
        (2, timedelta(days=1)),
        (2, timedelta(days=2) - timedelta(minutes=61)),
        (30, timedelta(days=29)),
    ],
)
def test_a_run_at_within_the_snapshot_s_life_is_accepted(days: int, ahead: timedelta) -> None:
    assert check(days, datetime.now(UTC) + ahead).job_type.job_type == "synthetic"
    assert check(days, None).job_type.job_type == "synthetic"
