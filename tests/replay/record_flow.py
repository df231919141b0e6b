"""The recorder's flow-control cases (workflows/flow_guard.py, engine/flow.py), each on an engine
of its own as the branch cases of `record_cases.py` (`record.py` starts it with the case's
settings):

- `synthetic-deadline`: a job with a `deadline` three seconds ahead, held back by a provider
  limit (concurrency 1, a slow job holds the slot): its deadline passes while it waits for room,
  `flow_expire` ends it (queued: no call) and the guard cancels its wait; it ends `cancelled`,
  JOB_DEADLINE_EXCEEDED, through the finalizer;
- `synthetic-ttl_admitted`: a job with a start-by time (`ttlSeconds`) admitted well before it
  (its EXECUTE sleeps past it): the TTL's timer fires during the call, `flow_expire` finds the
  job started and does nothing, the guard forgets the TTL and the job succeeds. Admitted before
  its start-by time is the deterministic one of the two TTL endings (the expiry needs the job
  still held when the timer fires; the deadline case already records `flow_expire` ending one);
- `synthetic-paused`: a job an operator pause holds (EXECUTE's `operator_pause` wait, no slot,
  its hold recorded), resumed when the pause is deleted: the pause waker's `limit-wake` signal
  ends its wait, the next EXECUTE runs and the job succeeds.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from engine.flow import JOB_DEADLINE_EXCEEDED, PauseMatch
from engine.limit_wait import LIMIT_WAKE_SIGNAL
from jobs.pauses import Pauses
from tests.integration.engine_helpers import scalar
from tests.replay import SENTINEL
from tests.replay.record_cases import (
    LIMITED,
    BranchCase,
    Fakes,
    Histories,
    closed_history,
    has,
    signals,
)
from tests.stack import Stack
from tests.support import eventually

ECHO = {"note": SENTINEL}
# The deadline case: how far ahead its deadline is, and how long the slow job holds the one
# slot (past the deadline, so the recorded job is still waiting for room when it passes).
DEADLINE_S = 3.0
HOLDER_MS = 8000
# The TTL case: its start-by time, and its call's length (well past it).
TTL_S = 3
TTL_CALL_MS = 7000
PAUSED_USER = "paused"


def local_activities(history: WorkflowHistory) -> list[str]:
    """The local activities' types, from their markers (JSON marker data)."""
    out = []
    for e in history.events:
        if e.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
            continue
        attrs = e.marker_recorded_event_attributes
        if attrs.marker_name == "core_local_activity":
            out.append(json.loads(attrs.details["data"].payloads[0].data)["activity_type"])
    return out


async def run_deadline(st: Stack, _: Fakes | None) -> Histories:
    holder = await st.create(job_type="synthetic", input={"delayMs": HOLDER_MS, "echo": ECHO})
    await st.wait_status(holder, "running")
    deadline = datetime.now(UTC) + timedelta(seconds=DEADLINE_S)
    job = await st.create(job_type="synthetic", input={"echo": ECHO}, deadline=deadline)
    history = await closed_history(st, job, expect="cancelled")
    row = await st.job(job)
    assert row.error_code == JOB_DEADLINE_EXCEEDED and row.started_at is None, row
    # The holder still held the slot when the deadline passed: the job ended waiting for room.
    assert (await st.job(holder)).lifecycle_status == "running"
    assert "flow_expire" in local_activities(history), local_activities(history)
    await st.wait_status(holder, "succeeded", timeout=30)
    return {"synthetic-{tag}-deadline": history}


async def run_ttl_admitted(st: Stack, _: Fakes | None) -> Histories:
    job = await st.create(
        job_type="synthetic", input={"delayMs": TTL_CALL_MS, "echo": ECHO}, ttl_seconds=TTL_S
    )
    history = await closed_history(st, job)
    row = await st.job(job)
    assert row.expires_at is not None and row.started_at < row.expires_at, row
    assert row.finished_at > row.expires_at, row  # its call ran past the start-by time
    assert "flow_expire" in local_activities(history), local_activities(history)
    return {"synthetic-{tag}-ttl_admitted": history}


async def run_paused(st: Stack, _: Fakes | None) -> Histories:
    admin = Pauses(st.parts.sessionmaker)
    pause = await admin.create(
        PauseMatch(user_id=PAUSED_USER, job_type="synthetic"),
        reason="replay recording",
        expires_at=None,
        actor="root",
    )
    job = await st.create(PAUSED_USER, job_type="synthetic", input={"echo": ECHO})

    async def holding() -> bool:
        sql = "SELECT count(*) FROM ai_pause_hold WHERE job_id = :j"
        return bool(await scalar(st.parts.sessionmaker, sql, j=job))

    await eventually(holding, timeout=30, what="the job held by the pause")
    assert (await st.job(job)).lifecycle_status == "queued"
    await admin.delete(pause.id, actor="root")
    history = await closed_history(st, job)
    assert LIMIT_WAKE_SIGNAL in signals(history), signals(history)
    assert has(history, EventType.EVENT_TYPE_TIMER_CANCELED), "the pause's wait was not cut short"
    return {"synthetic-{tag}-paused": history}


FLOW_CASES = (
    BranchCase("synthetic-deadline", lambda _: dict(LIMITED), run_deadline),
    BranchCase("synthetic-ttl_admitted", lambda _: {}, run_ttl_admitted),
    BranchCase("synthetic-paused", lambda _: {}, run_paused),
)
