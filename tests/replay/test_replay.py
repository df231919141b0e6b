"""Every recorded workflow history replays against today's workflow code.

Workers rebuild an open run by replaying its history through the code they run, so a deploy
that changes the commands a recorded run issued breaks every run in flight with a
non-determinism error. These tests replay the histories that `tests.replay.record` recorded
from real runs of each version of the code (`<workflow>-<tag>-<case>.json`) through the workflow
classes and the sandbox runner the workers use. No server is needed.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from temporalio import workflow
from temporalio.api.enums.v1 import EventType

from engine.contracts import (
    COMPLETE,
    LIMIT_WAITS,
    RECONCILER_WORKFLOW,
    CompleteResult,
    ExecuteResult,
    ExecutionPlan,
    JobWorkflowInput,
    JobWorkflowResult,
    StageInput,
)
from engine.definition import QUEUE_NAMES
from engine.limit_wait import LIMIT_WAIT_BACKSTOP_S
from jobs.types import default_catalog
from tests.replay import SENTINEL
from tests.replay.replaying import (
    BASELINE_TAG,
    SYNTHETIC_CASES,
    assert_non_determinism,
    changed_runner,
    current_workflows,
    event_index,
    execute_results,
    holds,
    local_activities,
    markers,
    patches,
    recorded,
    regular_activities,
    replay,
    replay_with,
    signals,
    synthetic,
    workflow_type,
)
from workflows import stages
from workflows.batch import BATCH_WORKFLOW
from workflows.job_workflow import JobStages, JobWorkflow
from workflows.limit_wait import MIN_WAIT_S

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741

SYSTEM_TYPES = {"reconciler": RECONCILER_WORKFLOW}
# The case names of the histories that pin a branch taken only by some jobs, not by every
# success: their own tests below (flow control's in test_replay_flow.py) check their shape.
BRANCH_CASES = (
    "chunked",
    "limit_wait",
    "delayed",
    "limit_wake",
    "reuse",
    "reuse_wait",
    "offpeak",
    "batch",
    "fallback",
    "deadline",
    "ttl_admitted",
    "paused",
)
# Every path the newest tags must cover: a success on each job queue (added below), the plain
# shape's other endings, each branch, the batch workflow and the reconciler.
PATHS = {
    ("synthetic", "success"),
    ("synthetic", "retry"),
    ("synthetic", "fail"),
    ("synthetic", "cancel"),
    ("synthetic", "limit_wait"),
    ("synthetic", "limit_wake"),
    ("synthetic", "delayed"),
    ("synthetic", "deadline"),
    ("synthetic", "ttl_admitted"),
    ("synthetic", "paused"),
    ("quiz_generation", "chunked"),
    ("quiz_generation", "fallback"),
    ("flashcard_generation", "reuse"),
    ("flashcard_generation", "reuse_wait"),
    ("flashcard_generation", "offpeak"),
    ("flashcard_generation", "batch"),
    (BATCH_WORKFLOW, "batch"),
    ("reconciler", "run"),
}


# ---- what was recorded ---------------------------------------------------------------------


def test_histories_cover_every_workflow_and_case() -> None:
    """The newest full recording (the newest tag with a reconciler run, `BASELINE_TAG` or later)
    and any tag recorded after it with `record --only` together cover each path through the
    job workflow, a success on each job queue, the batch workflow and the reconciler. Every job
    type runs the same workflow code (`JobWorkflow`), so a new job type needs no new history; a
    removed one fails the replay above while histories of it are kept."""
    records = recorded()
    full = max(r.tag for r in records if r.workflow == "reconciler")
    assert full >= BASELINE_TAG
    newest = {(r.workflow, r.case) for r in records if r.tag >= full}
    first_on_queue: dict[str, str] = {}
    for jt in default_catalog():
        first_on_queue.setdefault(jt.definition.queue.queue_name, jt.job_type)
    assert set(first_on_queue) == set(QUEUE_NAMES)
    expected = PATHS | {(job_type, "success") for job_type in first_on_queue.values()}
    missing = sorted(expected - newest)
    assert not missing, f"{missing}: record them (make replay-baseline, docs/versioning.md)"
    assert {r.tag for r in records} >= {BASELINE_TAG}, "the baseline's histories are kept"
    for r in records:
        assert workflow_type(r) == SYSTEM_TYPES.get(r.workflow, r.workflow), r.path.name
    size = sum(r.path.stat().st_size for r in records)
    assert size < 2_000_000, f"histories take {size} bytes; retire old tags"


def test_histories_hold_no_job_input() -> None:
    """Job inputs (and outputs, which echo them) stay in PostgreSQL. Every recorded input
    carried SENTINEL (the recorder checked that PostgreSQL got it)."""
    leaking = [r.path.name for r in recorded() if holds(SENTINEL, r.text)]
    assert leaking == []


def test_input_check_finds_a_string_inside_a_payload() -> None:
    """The check above looks inside payloads, where the JSON text alone would hide it."""
    r = next(x for x in recorded() if x.workflow == "synthetic" and x.case == "success")
    doc = json.loads(r.text)
    started = doc["events"][0]["workflowExecutionStartedEventAttributes"]
    payload = started["input"]["payloads"][0]
    arg = json.loads(base64.b64decode(payload["data"]))
    payload["data"] = base64.b64encode(json.dumps({**arg, "note": SENTINEL}).encode()).decode()
    tampered = json.dumps(doc)
    assert SENTINEL not in tampered
    assert holds(SENTINEL, tampered)
    assert not holds(SENTINEL, r.text)


# ---- replay --------------------------------------------------------------------------------


async def test_every_history_replays_against_current_code() -> None:
    records = recorded()
    assert records
    failures = await replay(current_workflows(), records)
    assert failures == {}


# ---- the replay can fail -------------------------------------------------------------------
# Changed copies of the job workflow (workflow type `synthetic`), deployed without a patch:
# replaying must report non-determinism for the histories the change contradicts, and only
# for them (the others, which the copy replays like the real workflow, show that the failures
# come from the change and not from the copy).


class _WithoutComplete(JobStages):
    """COMPLETE dropped from the end of a success."""

    @staticmethod
    async def _local(stage: Callable[[I], Awaitable[T]], arg: I) -> T:
        if stage is stages.complete:
            return cast(T, CompleteResult(calls=0, tokens_in=0, tokens_out=0, cost_micros=0))
        return await JobStages._local(stage, arg)


class _ExtraStage(JobStages):
    """A stage (a second RESOLVE) added after PREPARE."""

    @staticmethod
    async def _local(stage: Callable[[I], Awaitable[T]], arg: I) -> T:
        result = await JobStages._local(stage, arg)
        if stage is stages.prepare:
            await JobStages._local(stages.resolve, cast(StageInput, arg))  # a new command
        return result


class _LimitWaitsBackedOff(JobStages):
    """A provider limit's wait backed off like a pause (2, 4, 8... s, a timer no wake-up
    ends), instead of its own time or its wake-up."""

    @staticmethod
    async def _execute(inp: JobWorkflowInput, plan: ExecutionPlan, **kw: Any) -> ExecuteResult:
        result = await JobStages._execute(inp, plan, **kw)
        if result.gate_reason in LIMIT_WAITS:
            return dataclasses.replace(result, gate_reason="pause")
        return result


class _NoDelay(JobStages):
    """The delayed job's timer dropped: the job's runAt ignored."""

    async def execute_job(self, inp: JobWorkflowInput) -> JobWorkflowResult:
        return await JobStages.execute_job(self, dataclasses.replace(inp, runAt=""))


class _Changed:
    """The signal handlers of `JobWorkflow`, so that the copies replay signalled histories."""

    def __init__(self) -> None:
        self._copy = JobWorkflow()

    @workflow.signal(name="limit-wake")
    def limit_wake(self) -> None:
        self._copy.limit_wake()


@workflow.defn(name="synthetic")
class SyntheticWithoutComplete(_Changed):
    @workflow.run
    async def run(self, inp: JobWorkflowInput) -> JobWorkflowResult:
        return await _WithoutComplete(self._copy._wakes).execute_job(inp)


@workflow.defn(name="synthetic")
class SyntheticExtraStage(_Changed):
    @workflow.run
    async def run(self, inp: JobWorkflowInput) -> JobWorkflowResult:
        return await _ExtraStage(self._copy._wakes).execute_job(inp)


@workflow.defn(name="synthetic")
class SyntheticLimitWaitsBackedOff(_Changed):
    @workflow.run
    async def run(self, inp: JobWorkflowInput) -> JobWorkflowResult:
        return await _LimitWaitsBackedOff(self._copy._wakes).execute_job(inp)


@workflow.defn(name="synthetic")
class SyntheticNoDelay(_Changed):
    @workflow.run
    async def run(self, inp: JobWorkflowInput) -> JobWorkflowResult:
        return await _NoDelay(self._copy._wakes).execute_job(inp)


async def test_removing_a_stage_without_a_patch_breaks_replay() -> None:
    """Exactly the histories that ran COMPLETE (the successes) contradict the change."""
    records = synthetic(*SYNTHETIC_CASES)
    failures = await replay_with([SyntheticWithoutComplete], records, changed_runner())
    ran_complete = [r.path.name for r in records if COMPLETE in local_activities(r)]
    assert ran_complete and len(ran_complete) < len(records)
    assert_non_determinism(failures, ran_complete)


async def test_adding_an_activity_without_a_patch_breaks_replay() -> None:
    """Every synthetic history (each went past PREPARE) contradicts an extra stage."""
    records = synthetic(*SYNTHETIC_CASES)
    failures = await replay_with([SyntheticExtraStage], records, changed_runner())
    assert_non_determinism(failures, [r.path.name for r in records])


async def test_backing_off_a_limit_wait_without_a_patch_breaks_replay() -> None:
    """The limit histories pin the wait for room: code that backs a limit's wait off like a
    pause fails them (their wake-up cancelled the wait's timer), and only them (the other
    synthetic histories never waited on a limit, or, the deadline case, had the guard end its
    wait: the same commands either way)."""
    records = synthetic(*SYNTHETIC_CASES)
    failures = await replay_with([SyntheticLimitWaitsBackedOff], records, changed_runner())
    held = [r.path.name for r in records if r.case in ("limit_wait", "limit_wake")]
    assert held and len(held) < len(records)
    assert_non_determinism(failures, held)


async def test_dropping_the_delayed_start_without_a_patch_breaks_replay() -> None:
    """The delayed history pins the timer before RESOLVE: code that no longer waits for runAt
    fails it, and only it (the other synthetic histories carry no runAt)."""
    records = synthetic(*SYNTHETIC_CASES)
    failures = await replay_with([SyntheticNoDelay], records, changed_runner())
    delayed = [r.path.name for r in records if r.case == "delayed"]
    assert delayed and len(delayed) < len(records)
    assert_non_determinism(failures, delayed)


# ---- the shapes the histories pin ----------------------------------------------------------


def test_histories_of_the_plain_shape_run_every_stage_under_its_name() -> None:
    """prepare, resolve, execute, project and complete, each an activity of its own; a failure
    ends in finalize_failed after execute, a cancel in finalize_cancelled; no patch marker."""
    plain = [
        r
        for r in recorded()
        if r.tag >= BASELINE_TAG
        and r.workflow not in SYSTEM_TYPES
        and r.case not in BRANCH_CASES
        and r.workflow != BATCH_WORKFLOW
    ]
    assert {r.case for r in plain} >= {"success", "retry", "fail", "cancel"}
    for r in plain:
        assert patches(r) == [], r.path.name
        assert regular_activities(r) == ["execute"], r.path.name
        expected = {
            "success": ["prepare", "resolve", "project", COMPLETE],
            "retry": ["prepare", "resolve", "project", COMPLETE],
            "fail": ["prepare", "resolve", "finalize_failed"],
            "cancel": ["prepare", "resolve", "finalize_cancelled"],
        }[r.case]
        assert local_activities(r) == expected, r.path.name
        if r.case == "success":
            assert len(r.history.events) == SUCCESS_EVENTS, r.path.name


# A plain success: started, 3 workflow tasks, 4 local-activity markers, EXECUTE's 3 events,
# the status upsert and the completion.
SUCCESS_EVENTS = 16


def test_histories_of_a_chunked_job_run_each_chunk_then_merge() -> None:
    """One EXECUTE per chunk, each under an activity id that names its chunk, then MERGE before
    PROJECT and COMPLETE; about six events a chunk."""
    chunked = [r for r in recorded() if r.case == "chunked"]
    assert {r.tag for r in chunked} >= {BASELINE_TAG}
    for r in chunked:
        ids = [
            e.activity_task_scheduled_event_attributes.activity_id
            for e in r.history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        ]
        assert sorted(ids) == [f"execute-chunk-{n}" for n in range(len(ids))], r.path.name
        assert len(ids) >= 2 and set(regular_activities(r)) == {"execute"}
        assert local_activities(r) == ["prepare", "resolve", "merge", "project", COMPLETE]
        assert len(r.history.events) <= 25 + 6 * len(ids), len(r.history.events)


def test_histories_of_a_limit_wait_wait_for_room_not_a_backoff() -> None:
    """After each EXECUTE held back by a provider limit (`gate_reason` in LIMIT_WAITS) the next
    command is a timer of that wait as it is (a `concurrency` wait at most the backstop; no
    backoff, no jitter), which its wake-up signal may cut short; then EXECUTE again, and once
    admitted the run ends like a success: project, complete."""
    held = [r for r in recorded() if r.case in ("limit_wait", "limit_wake")]
    assert {r.tag for r in held} >= {BASELINE_TAG}
    for r in held:
        assert local_activities(r) == ["prepare", "resolve", "project", COMPLETE], r.path.name
        events = r.history.events
        results = execute_results(r)
        assert len(results) == len(regular_activities(r)) >= 2, r.path.name
        assert set(regular_activities(r)) == {"execute"}, r.path.name
        *waits, (_, last) = results
        assert last["gate_wait_s"] == 0 and last["output_hash"], (r.path.name, last)
        for i, res in waits:
            assert res["gate_reason"] in LIMIT_WAITS and res["gate_wait_s"] > 0, res
            assert res["attempt"] == 1, res  # a limit's wait spends no attempt
            nxt = next(
                e
                for e in events[i + 1 :]
                if e.event_type
                in (
                    EventType.EVENT_TYPE_TIMER_STARTED,
                    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
                    EventType.EVENT_TYPE_MARKER_RECORDED,
                )
            )
            assert nxt.event_type == EventType.EVENT_TYPE_TIMER_STARTED, (r.path.name, i)
            fire = nxt.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
            wait = res["gate_wait_s"]
            if res["gate_reason"] == "concurrency":
                wait = min(wait, LIMIT_WAIT_BACKSTOP_S)
            assert abs(fire.total_seconds() - max(wait, MIN_WAIT_S)) < 0.001, (r.path.name, fire)
        assert events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
    woken = next(r for r in held if r.case == "limit_wake")
    assert signals(woken) == ["limit-wake"], woken.path.name


# ---- the branches only some jobs take ------------------------------------------------------

# Per branch case: its local activities, its regular activities and the signals it received
# (tests/replay/record_cases.py says how each was recorded).
BRANCH_SHAPES: dict[tuple[str, str], tuple[list[str], list[str], list[str]]] = {
    ("synthetic", "delayed"): (["prepare", "resolve", "project", COMPLETE], ["execute"], []),
    ("synthetic", "limit_wake"): (
        ["prepare", "resolve", "project", COMPLETE],
        ["execute", "execute"],
        ["limit-wake"],
    ),
    ("flashcard_generation", "reuse"): (
        ["prepare", "resolve", "reuse", "project", COMPLETE],
        [],
        [],
    ),
    ("flashcard_generation", "reuse_wait"): (
        ["prepare", "resolve", "reuse", "reuse", "project", COMPLETE],
        [],
        ["reuse-source-ended"],
    ),
    ("flashcard_generation", "offpeak"): (
        ["prepare", "resolve", "project", COMPLETE],
        ["execute"],
        [],
    ),
    ("flashcard_generation", "batch"): (
        ["prepare", "resolve", "batch_enroll", "batch_collect", "project", COMPLETE],
        [],
        ["batch-result"],
    ),
    ("quiz_generation", "fallback"): (
        ["prepare", "resolve", "project", COMPLETE],
        ["execute"],
        [],
    ),
    (BATCH_WORKFLOW, "batch"): (["batch_timing"], ["batch_submit", "batch_poll"], []),
}


def test_histories_of_each_branch_run_its_stages() -> None:
    """Each branch that only some jobs take (a delayed start, a limit's wake-up, result reuse
    and its wait, an off-peak hold, the batch tier, a provider fallback) has a history that
    issued that branch's commands, and the batch tier's own workflow has one: a run open in
    production on any of them is replayed here. The timers sit where the branch puts them:
    the delayed job's between PREPARE and RESOLVE, the off-peak hold's between RESOLVE and
    EXECUTE; the fallback's memo is upserted after EXECUTE."""
    by_case = {(r.workflow, r.case): r for r in recorded() if r.tag >= BASELINE_TAG}
    assert set(BRANCH_SHAPES) <= set(by_case), sorted(set(BRANCH_SHAPES) - set(by_case))
    for key, (local, regular, signalled) in BRANCH_SHAPES.items():
        r = by_case[key]
        assert patches(r) == [], r.path.name
        assert local_activities(r) == local, r.path.name
        assert regular_activities(r) == regular, r.path.name
        assert signals(r) == signalled, r.path.name
        assert r.history.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
    for case, before, after in (("delayed", "prepare", "resolve"), ("offpeak", "resolve", None)):
        r = next(x for (_, c), x in by_case.items() if c == case)
        lo = markers(r, "core_local_activity")
        names = local_activities(r)
        timer = event_index(r, EventType.EVENT_TYPE_TIMER_STARTED)
        events = [e.event_id for e in r.history.events]
        assert lo[names.index(before)].event_id < events[timer], r.path.name
        if after is not None:
            assert events[timer] < lo[names.index(after)].event_id, r.path.name
        else:  # the hold ends before EXECUTE is scheduled
            scheduled = event_index(r, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
            assert timer < scheduled, r.path.name
    moved = by_case[("quiz_generation", "fallback")]
    executed = event_index(moved, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
    memo = event_index(moved, EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED)
    assert executed < memo, moved.path.name
