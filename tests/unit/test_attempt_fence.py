"""An EXECUTE attempt's identity: its lock token names its run, chunk and attempt (so two
attempts of one workflow never hold the job under one token), and it checks its lock before
sending only when a later attempt may exist."""

from __future__ import annotations

import datetime as dt
import uuid

from db.lifecycle import lock_holder
from jobs.attempt_start import Start, may_be_taken_over


def start(attempt: int, chunk_no: int | None = None, run_id: str | None = "run-1") -> Start:
    job = uuid.UUID(int=1)
    return Start(job, f"ai-interactive:quiz:{job}", "1234@host", 60, run_id, chunk_no, attempt, 1)


def test_each_attempt_has_its_own_token_under_the_workflows_lock() -> None:
    tokens = {
        start(1).token,
        start(2).token,
        start(1, run_id="run-2").token,
        start(1, chunk_no=0).token,
        start(1, chunk_no=1).token,
    }
    assert len(tokens) == 5
    # The workflow still owns the job: the other stages' checks read the owner part.
    assert {lock_holder(t) for t in tokens} == {start(1).owner}
    assert start(3, chunk_no=2).token.endswith("/c2a3@1234@host")
    assert start(1).fence.token == start(1).token and start(1, 4).fence.chunk_no == 4


def test_only_an_attempt_that_may_have_been_taken_over_checks_before_sending() -> None:
    ten = dt.timedelta(seconds=10)
    assert not may_be_taken_over(ten, 0.05)
    assert not may_be_taken_over(ten, 4.9)
    assert may_be_taken_over(ten, 5.0)
    assert may_be_taken_over(None, 0.0)
