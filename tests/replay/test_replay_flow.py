"""The flow-control histories (tests/replay/record_flow.py says how each was recorded): the
shapes they pin, and that dropping the guard of a job's start-by time and deadline without a
patch fails exactly the histories that armed it."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

from temporalio import workflow
from temporalio.api.enums.v1 import EventType

from engine.contracts import (
    COMPLETE,
    LIMIT_WAITS,
    JobWorkflowInput,
    JobWorkflowResult,
    PrepareResult,
)
from engine.flow import OPERATOR_PAUSE, PAUSE_BACKSTOP_S
from tests.replay.replaying import (
    BASELINE_TAG,
    SYNTHETIC_CASES,
    Recorded,
    assert_non_determinism,
    changed_runner,
    event_index,
    execute_results,
    local_activities,
    markers,
    patches,
    recorded,
    regular_activities,
    replay_with,
    signals,
    synthetic,
)
from workflows import stages
from workflows.job_workflow import JobStages, JobWorkflow

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741

FLOW_CASES = ("deadline", "ttl_admitted", "paused")
# Per case: its local activities, its regular activities and the signals it received.
FLOW_SHAPES: dict[str, tuple[list[str], list[str], list[str]]] = {
    "deadline": (["prepare", "resolve", "flow_expire", "finalize_cancelled"], ["execute"], []),
    "ttl_admitted": (["prepare", "resolve", "flow_expire", "project", COMPLETE], ["execute"], []),
    "paused": (["prepare", "resolve", "project", COMPLETE], ["execute", "execute"], ["limit-wake"]),
}


def flow_histories() -> dict[str, Recorded]:
    found = {r.case: r for r in recorded() if r.tag >= BASELINE_TAG and r.case in FLOW_CASES}
    assert set(found) == set(FLOW_CASES), sorted(set(FLOW_CASES) - set(found))
    return found


def event_id(r: Recorded, event_type: int, after: int = 0) -> int:
    return int(r.history.events[event_index(r, event_type, after)].event_id)


def marker_id(r: Recorded, activity: str) -> int:
    names = local_activities(r)
    return int(markers(r, "core_local_activity")[names.index(activity)].event_id)


def test_flow_histories_run_their_stages() -> None:
    """Each run issued its path's commands, with no patch, and completed (a job flow control
    ended is `cancelled` in PostgreSQL; its run returns)."""
    for case, (local, regular, signalled) in FLOW_SHAPES.items():
        r = flow_histories()[case]
        assert patches(r) == [], r.path.name
        assert local_activities(r) == local, r.path.name
        assert regular_activities(r) == regular, r.path.name
        assert signals(r) == signalled, r.path.name
        assert r.history.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED


def test_an_armed_guard_times_the_stages_after_prepare() -> None:
    """A job with a start-by time or deadline: the guard's timer is started right after PREPARE,
    before RESOLVE, and fires; `flow_expire` looks then. At the deadline the job was still
    waiting for room (EXECUTE returned a limit's wait), and its wait's timer is cancelled after
    `flow_expire`; the TTL fired while the admitted job's call ran (before it completed)."""
    found = flow_histories()
    for case in ("deadline", "ttl_admitted"):
        r = found[case]
        guard = event_id(r, EventType.EVENT_TYPE_TIMER_STARTED)
        assert marker_id(r, "prepare") < guard < marker_id(r, "resolve"), r.path.name
        fired = r.history.events[event_index(r, EventType.EVENT_TYPE_TIMER_FIRED)]
        assert fired.timer_fired_event_attributes.started_event_id == guard, r.path.name
        assert fired.event_id < marker_id(r, "flow_expire"), r.path.name
    late = found["deadline"]
    [(_, waited)] = execute_results(late)
    assert waited["gate_reason"] in LIMIT_WAITS and waited["gate_wait_s"] > 0, waited
    cancelled = event_id(late, EventType.EVENT_TYPE_TIMER_CANCELED)
    assert marker_id(late, "flow_expire") < cancelled < marker_id(late, "finalize_cancelled")
    kept = found["ttl_admitted"]
    [(done, result)] = execute_results(kept)
    assert result["output_hash"], result
    assert marker_id(kept, "flow_expire") < kept.history.events[done].event_id


def test_a_paused_job_waits_for_its_resume_without_a_guard() -> None:
    """An operator pause's hold: EXECUTE returns the `operator_pause` wait, the next command is
    its timer (the backstop), the pause waker's `limit-wake` signal cancels it and EXECUTE runs
    again; a job without a start-by time or deadline arms no guard (no timer before EXECUTE)."""
    r = flow_histories()["paused"]
    (held_at, held), (_, ran) = execute_results(r)
    assert held["gate_reason"] == OPERATOR_PAUSE and held["attempt"] == 1, held
    assert ran["gate_wait_s"] == 0 and ran["output_hash"], ran
    first_timer = event_index(r, EventType.EVENT_TYPE_TIMER_STARTED)
    assert first_timer > held_at, r.path.name
    fire = r.history.events[first_timer].timer_started_event_attributes.start_to_fire_timeout
    assert 0 < fire.ToTimedelta().total_seconds() <= PAUSE_BACKSTOP_S, fire
    signalled = event_index(r, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
    cancelled = event_index(r, EventType.EVENT_TYPE_TIMER_CANCELED)
    assert first_timer < signalled < cancelled, r.path.name


# ---- dropping the guard without a patch fails replay ---------------------------------------


class _NoFlowGuard(JobStages):
    """The job's start-by time and deadline ignored: PREPARE's report of them dropped, so the
    guard is never armed."""

    @staticmethod
    async def _local(stage: Callable[[I], Awaitable[T]], arg: I) -> T:
        result = await JobStages._local(stage, arg)
        if stage is stages.prepare:
            prep = cast(PrepareResult, result)
            return cast(T, dataclasses.replace(prep, expires_at="", deadline=""))
        return result


@workflow.defn(name="synthetic")
class SyntheticNoFlowGuard:
    def __init__(self) -> None:
        self._copy = JobWorkflow()

    @workflow.run
    async def run(self, inp: JobWorkflowInput) -> JobWorkflowResult:
        return await _NoFlowGuard(self._copy._wakes).execute_job(inp)

    @workflow.signal(name="limit-wake")
    def limit_wake(self) -> None:
        self._copy.limit_wake()


async def test_dropping_the_flow_guard_without_a_patch_breaks_replay() -> None:
    """The deadline and TTL histories pin the guard's timer: code that no longer arms it fails
    them, and only them (no other synthetic history had a start-by time or deadline, the paused
    one included)."""
    records = synthetic(*SYNTHETIC_CASES)
    failures = await replay_with([SyntheticNoFlowGuard], records, changed_runner())
    armed = [r.path.name for r in records if r.case in ("deadline", "ttl_admitted")]
    assert len(armed) == 2 and len(armed) < len(records)
    assert_non_determinism(failures, armed)
