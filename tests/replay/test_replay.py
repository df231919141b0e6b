"""Every recorded workflow history replays against today's workflow code.

Workers rebuild an open run by replaying its history through the code they run, so a deploy
that changes the commands a recorded run issued breaks every run in flight with a
non-determinism error. These tests replay the histories that `tests.replay.record` recorded
from real runs of each version of the code (`<workflow>-<tag>-<case>.json`) through the workflow
classes and the sandbox runner the workers use. No server is needed.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any, TypeVar, cast

from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from engine.contracts import (
    COMPLETE,
    LIMIT_WAITS,
    RECONCILER_WORKFLOW,
    RELAY_WORKFLOW,
    CompleteResult,
    ExecuteResult,
    ExecutionPlan,
    JobWorkflowInput,
    JobWorkflowResult,
)
from engine.definition import QUEUE_NAMES
from engine.payloads import DATA_CONVERTER
from jobs.types import default_catalog
from runtime.worker import sandbox_runner
from tests.replay import HISTORIES, SENTINEL
from workflows import stages
from workflows.batch import BATCH_WORKFLOW, BatchWorkflow
from workflows.job_workflow import GATE_WAIT_CAP_S, JobStages, JobWorkflow
from workflows.patches import (
    BATCH_TIER,
    CHUNKED_FAN_OUT,
    DELAYED_START,
    EXACT_LIMIT_WAITS,
    EXECUTE_OWNS_RUNNING,
    FALLBACK_MEMO,
    FIVE_STAGES,
    LIMIT_WAKE,
    OFFPEAK_HOLD,
    RESULT_REUSE,
    SKIP_COMPLETE_STAGE,
)
from workflows.system import ReconcilerWorkflow, RelayShardWorkflow, RelayWorkflow

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741

NAME = re.compile(r"^(?P<workflow>[a-z_]+)-v(?P<tag>[0-9]+)-(?P<case>[a-z_]+)\.json$")
SYSTEM_TYPES = {"relay": RELAY_WORKFLOW, "reconciler": RECONCILER_WORKFLOW}
# The first tag recorded with the `skip-complete-stage` patch.
PATCH_TAG = 2
# The first tag recorded with the `execute-owns-running` patch.
EXECUTE_TAG = 3
# The first tag recorded with the `five-stages` patch.
FIVE_STAGES_TAG = 4
# The first tag recorded with a chunked job (the `chunked-fan-out` patch).
CHUNKED_TAG = 5
# The first tag recorded with a job held back by a provider limit (the `exact-limit-waits` patch).
LIMIT_WAIT_TAG = 6
# The first tag recorded with the branch cases of tests/replay/record_cases.py (a delayed job, a
# limit's wake-up, result reuse, an off-peak hold, the batch tier and its `ai_batch` workflow).
BRANCHES_TAG = 7
# The case names of the histories that pin a branch taken only by some jobs, not by every
# success: their own tests below check their shape.
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
)


@dataclass(frozen=True)
class Recorded:
    path: Path
    workflow: str  # job type, or "relay" / "reconciler"
    tag: int
    case: str
    text: str

    @cached_property
    def history(self) -> WorkflowHistory:
        # The file does not hold the workflow id. Replay does not depend on it: the workflow
        # only passes it on to activities.
        return WorkflowHistory.from_json(self.path.stem, self.text)


@cache
def recorded() -> tuple[Recorded, ...]:
    out = []
    for path in sorted(HISTORIES.glob("*.json")):
        m = NAME.match(path.name)
        assert m, f"{path.name}: expected <workflow>-v<N>-<case>.json"
        out.append(Recorded(path, m["workflow"], int(m["tag"]), m["case"], path.read_text("utf-8")))
    return tuple(out)


def current_workflows() -> list[type]:
    """What the workers register: a workflow per job type, the batch tier's `ai_batch`, the
    relay and the reconciler."""
    return [JobWorkflow, BatchWorkflow, RelayShardWorkflow, RelayWorkflow, ReconcilerWorkflow]


async def replay(workflows: list[type], records: Sequence[Recorded]) -> dict[str, Exception]:
    """Replay failures by file name (empty: every history replayed)."""
    return await replay_with(workflows, records, sandbox_runner())


async def replay_with(
    workflows: list[type], records: Sequence[Recorded], runner: SandboxedWorkflowRunner
) -> dict[str, Exception]:
    by_run = {r.history.run_id: r.path.name for r in records}
    histories = [r.history for r in records]

    async def each() -> AsyncIterator[WorkflowHistory]:
        for h in histories:
            yield h

    # The engine's payload converter: recorded payloads decode as the workers decode them.
    results = await Replayer(
        workflows=workflows, workflow_runner=runner, data_converter=DATA_CONVERTER
    ).replay_workflows(each(), raise_on_replay_failure=False)
    assert len(by_run) == len(histories)  # run ids are unique, so no failure hides another
    return {by_run[run_id]: exc for run_id, exc in results.replay_failures.items()}


def workflow_type(r: Recorded) -> str:
    first = r.history.events[0]
    return str(first.workflow_execution_started_event_attributes.workflow_type.name)


def regular_activities(r: Recorded) -> list[str]:
    """The regular activities a history scheduled (each retry is the same scheduled one)."""
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in r.history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


def local_activities(r: Recorded) -> list[str]:
    return [
        json.loads(marker_detail(e, "data"))["activity_type"]
        for e in markers(r, "core_local_activity")
    ]


def patches(r: Recorded) -> list[str]:
    return [json.loads(marker_detail(e, "patch-data"))["id"] for e in markers(r, "core_patch")]


def markers(r: Recorded, name: str) -> list[Any]:
    return [
        e
        for e in r.history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == name
    ]


def marker_detail(event: Any, key: str) -> bytes:
    return bytes(event.marker_recorded_event_attributes.details[key].payloads[0].data)


def holds(needle: str, history_json: str) -> bool:
    """Whether a history holds `needle`: in its JSON text, or inside a payload (the JSON holds
    payload data base64-encoded, the protobuf encoding holds it verbatim)."""
    raw = History(events=WorkflowHistory.from_json("x", history_json).events).SerializeToString()
    return needle in history_json or needle.encode() in raw


# ---- what was recorded ---------------------------------------------------------------------


def test_histories_cover_every_workflow_and_case() -> None:
    """The newest full recording (the newest tag with a reconciler run) and any tag recorded
    after it with `record --only` together cover each path through the job workflow, a success
    on each job queue, and the reconciler; the retired relay workflow's histories are kept from
    older tags. Every job type runs the same workflow code (`JobWorkflow`), so a new job type
    needs no new history; a removed one fails the replay above while histories of it are
    kept."""
    records = recorded()
    full = max(r.tag for r in records if r.workflow == "reconciler")
    newest = {(r.workflow, r.case) for r in records if r.tag >= full}
    first_on_queue: dict[str, str] = {}
    for jt in default_catalog():
        first_on_queue.setdefault(jt.definition.queue.queue_name, jt.job_type)
    assert set(first_on_queue) == set(QUEUE_NAMES)
    expected = {(job_type, "success") for job_type in first_on_queue.values()}
    expected |= {("synthetic", c) for c in ("success", "retry", "fail", "cancel")}
    expected |= {("quiz_generation", "chunked"), ("synthetic", "limit_wait")}
    expected |= {("reconciler", "run")}
    assert expected <= newest, sorted(expected - newest)
    # The retired relay workflow records nothing new; its kept histories still replay (above).
    assert any(r.workflow == "relay" for r in records)
    for r in records:
        assert workflow_type(r) == SYSTEM_TYPES.get(r.workflow, r.workflow), r.path.name
    size = sum(r.path.stat().st_size for r in records)
    assert size < 2_000_000, f"histories take {size} bytes; retire old tags"


def test_histories_before_the_patch_ran_complete_and_after_it_do_not() -> None:
    """Both branches of the `skip-complete-stage` gate are covered by recorded histories."""
    succeeded = [
        r for r in recorded() if r.workflow not in SYSTEM_TYPES and r.case in ("success", "retry")
    ]
    assert {r.tag for r in succeeded} >= {PATCH_TAG - 1, PATCH_TAG}
    for r in succeeded:
        stages = local_activities(r)
        if r.tag < PATCH_TAG:
            assert stages == ["prepare", "resolve", "project", COMPLETE], r.path.name
            assert patches(r) == [], r.path.name
        elif r.tag < FIVE_STAGES_TAG:
            assert COMPLETE not in stages, r.path.name
        if r.tag == PATCH_TAG:
            assert patches(r) == [SKIP_COMPLETE_STAGE], r.path.name


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
# Two changed copies of the job workflow (workflow type `synthetic`), deployed without a
# patch: replaying must report non-determinism for histories the change contradicts.


class _WithoutComplete(JobStages):
    """The `skip-complete-stage` change made without `workflow.patched`."""

    @staticmethod
    async def _local(stage: Callable[[I], Awaitable[T]], arg: I) -> T:
        if stage is stages.complete:
            return cast(T, CompleteResult(calls=0, tokens_in=0, tokens_out=0, cost_micros=0))
        return await JobStages._local(stage, arg)


class _ExtraResolve(JobStages):
    """A pause (a timer) added after PREPARE without `workflow.patched`."""

    @staticmethod
    async def _local(stage: Callable[[I], Awaitable[T]], arg: I) -> T:
        result = await JobStages._local(stage, arg)
        if stage is stages.prepare:
            await asyncio.sleep(1)  # a durable timer in workflow code: a new command
        return result


class _LimitWaitsBackedOff(JobStages):
    """The old gate loop: a provider limit's wait backed off like a pause (2, 4, 8... s), the
    `exact-limit-waits` patch never asked."""

    @staticmethod
    async def _execute(inp: JobWorkflowInput, plan: ExecutionPlan, **kw: Any) -> ExecuteResult:
        result = await JobStages._execute(inp, plan, **kw)
        if result.gate_reason in LIMIT_WAITS:
            return dataclasses.replace(result, gate_reason="pause")
        return result


@workflow.defn(name="synthetic")
class SyntheticWithoutComplete(_WithoutComplete):
    @workflow.run
    async def run(self, inp: JobWorkflowInput) -> JobWorkflowResult:
        return await self.execute_job(inp)


@workflow.defn(name="synthetic")
class SyntheticExtraResolve(_ExtraResolve):
    @workflow.run
    async def run(self, inp: JobWorkflowInput) -> JobWorkflowResult:
        return await self.execute_job(inp)


@workflow.defn(name="synthetic")
class SyntheticLimitWaitsBackedOff(_LimitWaitsBackedOff):
    @workflow.run
    async def run(self, inp: JobWorkflowInput) -> JobWorkflowResult:
        return await self.execute_job(inp)


def changed_runner() -> SandboxedWorkflowRunner:
    """The workers' sandbox, which must also pass this test module through: it defines the
    changed classes and imports pytest."""
    return SandboxedWorkflowRunner(
        restrictions=sandbox_runner().restrictions.with_passthrough_modules("tests")
    )


def synthetic(*cases: str) -> list[Recorded]:
    return [r for r in recorded() if r.workflow == "synthetic" and r.case in cases]


def assert_non_determinism(failures: dict[str, Exception], names: list[str]) -> None:
    assert sorted(failures) == sorted(names)
    for name, exc in failures.items():
        assert isinstance(exc, workflow.NondeterminismError), (name, repr(exc))


async def test_removing_a_stage_without_a_patch_breaks_replay() -> None:
    """Exactly the histories that ran COMPLETE (succeeded before the patch) contradict the
    change; the others, which the copy replays like the real workflow, show that the failures
    come from the change and not from the copy."""
    records = synthetic("success", "retry", "fail", "cancel")
    failures = await replay_with([SyntheticWithoutComplete], records, changed_runner())
    ran_complete = [r.path.name for r in records if COMPLETE in local_activities(r)]
    assert ran_complete and len(ran_complete) < len(records)
    assert_non_determinism(failures, ran_complete)


async def test_adding_an_activity_without_a_patch_breaks_replay() -> None:
    """Every synthetic history (each went past PREPARE) contradicts an extra stage."""
    records = synthetic("success", "retry", "fail", "cancel")
    failures = await replay_with([SyntheticExtraResolve], records, changed_runner())
    assert_non_determinism(failures, [r.path.name for r in records])


async def test_backing_off_a_limit_wait_without_the_patch_breaks_replay() -> None:
    """The limit_wait histories pin the patched branch: code that backs a limit's wait off
    like a pause (no `exact-limit-waits` check) fails them, and only them (the other synthetic
    histories never waited on a limit and replay through the copy)."""
    records = synthetic("success", "retry", "fail", "cancel", "limit_wait")
    failures = await replay_with([SyntheticLimitWaitsBackedOff], records, changed_runner())
    held = [r.path.name for r in records if r.case == "limit_wait"]
    assert held and len(held) < len(records)
    assert_non_determinism(failures, held)


def test_histories_after_execute_took_the_lock_run_prepare_then_execute_only() -> None:
    """From tag 3 on (`execute-owns-running`): no RESOLVE, and PROJECT only when the projection
    inside EXECUTE failed; histories before it keep their five-stage shape."""
    succeeded = [
        r for r in recorded() if r.workflow not in SYSTEM_TYPES and r.case in ("success", "retry")
    ]
    assert {r.tag for r in succeeded} >= {EXECUTE_TAG - 1, EXECUTE_TAG}
    for r in succeeded:
        if r.tag >= FIVE_STAGES_TAG:
            continue  # the five-stage shape, pinned below
        if r.tag >= EXECUTE_TAG:
            assert local_activities(r) == ["prepare"], r.path.name
            assert EXECUTE_OWNS_RUNNING in patches(r), r.path.name
        else:
            assert "resolve" in local_activities(r), r.path.name
            assert EXECUTE_OWNS_RUNNING not in patches(r), r.path.name


def test_histories_from_the_five_stage_shape_run_every_stage_under_its_name() -> None:
    """From tag 4 on (`five-stages`): prepare, resolve, execute, project and complete, each an
    activity of its own; a failure ends in finalize_failed after execute, a cancel in
    finalize_cancelled."""
    newest = [
        r
        for r in recorded()
        if r.tag >= FIVE_STAGES_TAG
        and r.workflow not in SYSTEM_TYPES
        and r.case not in BRANCH_CASES
    ]
    assert {r.case for r in newest} >= {"success", "retry", "fail", "cancel"}
    for r in newest:
        assert patches(r) == [FIVE_STAGES], r.path.name
        assert regular_activities(r) == ["execute"], r.path.name
        expected = {
            "success": ["prepare", "resolve", "project", COMPLETE],
            "retry": ["prepare", "resolve", "project", COMPLETE],
            "fail": ["prepare", "resolve", "finalize_failed"],
            "cancel": ["prepare", "resolve", "finalize_cancelled"],
        }[r.case]
        assert local_activities(r) == expected, r.path.name


def test_histories_of_a_chunked_job_run_each_chunk_then_merge() -> None:
    """From tag 5 on (`chunked-fan-out`, asked only by a chunked job): one EXECUTE per chunk,
    each under an activity id that names its chunk, then MERGE before PROJECT and COMPLETE;
    about six events a chunk."""
    chunked = [r for r in recorded() if r.case == "chunked"]
    assert {r.tag for r in chunked} >= {CHUNKED_TAG}
    for r in chunked:
        assert patches(r) == [FIVE_STAGES, CHUNKED_FAN_OUT], r.path.name
        ids = [
            e.activity_task_scheduled_event_attributes.activity_id
            for e in r.history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        ]
        assert sorted(ids) == [f"execute-chunk-{n}" for n in range(len(ids))], r.path.name
        assert len(ids) >= 2 and set(regular_activities(r)) == {"execute"}
        assert local_activities(r) == ["prepare", "resolve", "merge", "project", COMPLETE]
        assert len(r.history.events) <= 25 + 6 * len(ids), len(r.history.events)


def execute_results(r: Recorded) -> list[tuple[int, dict[str, Any]]]:
    """(event index, decoded ExecuteResult) of every EXECUTE that completed, in order."""
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in r.history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    return [
        (i, json.loads(e.activity_task_completed_event_attributes.result.payloads[0].data))
        for i, e in enumerate(r.history.events)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and scheduled[e.activity_task_completed_event_attributes.scheduled_event_id] == "execute"
    ]


def test_histories_of_a_limit_wait_sleep_the_exact_wait() -> None:
    """From tag 6 on (`exact-limit-waits`, asked only when EXECUTE returns a provider limit's
    wait): after each EXECUTE held back by a limit (`gate_reason` in LIMIT_WAITS) the next
    commands are the patch marker (the first time only) and a timer of that exact wait (1 s at
    least) plus up to 10 % jitter, shorter than the growing backoff the old branch would sleep
    (2, 4, 8... s), so the history pins the new branch; then EXECUTE again, and once admitted the
    run ends like a success: project, complete."""
    held = [r for r in recorded() if r.case == "limit_wait"]
    assert {r.tag for r in held} >= {LIMIT_WAIT_TAG}
    for r in held:
        assert patches(r) == [FIVE_STAGES, EXACT_LIMIT_WAITS], r.path.name
        assert local_activities(r) == ["prepare", "resolve", "project", COMPLETE], r.path.name
        events = r.history.events
        results = execute_results(r)
        assert len(results) == len(regular_activities(r)) >= 2, r.path.name
        assert set(regular_activities(r)) == {"execute"}, r.path.name
        *waits, (_, last) = results
        assert last["gate_wait_s"] == 0 and last["output_hash"], (r.path.name, last)
        [marker] = markers(r, "core_patch")[1:]
        for looks, (i, res) in enumerate(waits, start=1):
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
                and e.event_id != marker.event_id
            )
            assert nxt.event_type == EventType.EVENT_TYPE_TIMER_STARTED, (r.path.name, i)
            fire = nxt.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
            exact = max(res["gate_wait_s"], 1.0)
            backoff = max(res["gate_wait_s"], min(2.0**looks, GATE_WAIT_CAP_S))
            assert exact <= fire.total_seconds() <= exact * 1.1 < backoff, (r.path.name, fire)
        # The marker sits between the first held EXECUTE's result and its timer.
        first_wait = waits[0][0]
        first_timer = next(
            j for j, e in enumerate(events) if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
        )
        assert events[first_wait].event_id < marker.event_id, r.path.name
        assert marker.event_id < events[first_timer].event_id, r.path.name
        assert events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED


# ---- the branches only some jobs take (tag v7 on) ------------------------------------------

# Per branch case: the patches its run asked, its local activities, its regular activities and
# the signals it received (tests/replay/record_cases.py says how each was recorded).
BRANCH_SHAPES: dict[tuple[str, str], tuple[list[str], list[str], list[str], list[str]]] = {
    ("synthetic", "delayed"): (
        [FIVE_STAGES, DELAYED_START],
        ["prepare", "resolve", "project", COMPLETE],
        ["execute"],
        [],
    ),
    ("synthetic", "limit_wake"): (
        [FIVE_STAGES, LIMIT_WAKE],
        ["prepare", "resolve", "project", COMPLETE],
        ["execute", "execute"],
        ["limit-wake"],
    ),
    ("flashcard_generation", "reuse"): (
        [FIVE_STAGES, RESULT_REUSE],
        ["prepare", "resolve", "reuse", "project", COMPLETE],
        [],
        [],
    ),
    ("flashcard_generation", "reuse_wait"): (
        [FIVE_STAGES, RESULT_REUSE],
        ["prepare", "resolve", "reuse", "reuse", "project", COMPLETE],
        [],
        ["reuse-source-ended"],
    ),
    ("flashcard_generation", "offpeak"): (
        [FIVE_STAGES, OFFPEAK_HOLD],
        ["prepare", "resolve", "project", COMPLETE],
        ["execute"],
        [],
    ),
    ("flashcard_generation", "batch"): (
        [FIVE_STAGES, BATCH_TIER],
        ["prepare", "resolve", "batch_enroll", "batch_collect", "project", COMPLETE],
        [],
        ["batch-result"],
    ),
    ("quiz_generation", "fallback"): (
        [FIVE_STAGES, FALLBACK_MEMO],
        ["prepare", "resolve", "project", COMPLETE],
        ["execute"],
        [],
    ),
    (BATCH_WORKFLOW, "batch"): ([], ["batch_timing"], ["batch_submit", "batch_poll"], []),
}


def signals(r: Recorded) -> list[str]:
    return [
        e.workflow_execution_signaled_event_attributes.signal_name
        for e in r.history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]


def event_index(r: Recorded, event_type: int, after: int = 0) -> int:
    return next(
        i for i, e in enumerate(r.history.events) if i >= after and e.event_type == event_type
    )


def test_histories_of_each_branch_ask_its_patch_and_run_its_stages() -> None:
    """From tag 7 on, each branch that only some jobs take has a history that asked its patch
    (`delayed-start`, `limit-wake`, `result-reuse`, `offpeak-hold`, `batch-tier`,
    `provider-fallback-memo`) and issued that branch's commands, and the batch tier's own
    workflow has one: a run open in production on any of them is replayed here. The timers sit
    where the branch puts them: the delayed job's between PREPARE and RESOLVE, the off-peak
    hold's between RESOLVE and EXECUTE; the fallback's memo is upserted after EXECUTE."""
    by_case = {(r.workflow, r.case): r for r in recorded() if r.tag >= BRANCHES_TAG}
    assert set(BRANCH_SHAPES) <= set(by_case), sorted(set(BRANCH_SHAPES) - set(by_case))
    for key, (patch_ids, local, regular, signalled) in BRANCH_SHAPES.items():
        r = by_case[key]
        assert patches(r) == patch_ids, r.path.name
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


class _NoDelay(JobStages):
    """The `delayed-start` timer dropped without `workflow.deprecate_patch`: the job's runAt
    ignored."""

    async def execute_job(self, inp: JobWorkflowInput) -> JobWorkflowResult:
        return await JobStages.execute_job(self, dataclasses.replace(inp, runAt=""))


@workflow.defn(name="synthetic")
class SyntheticNoDelay(_NoDelay):
    @workflow.run
    async def run(self, inp: JobWorkflowInput) -> JobWorkflowResult:
        return await self.execute_job(inp)


async def test_dropping_the_delayed_start_without_the_patch_breaks_replay() -> None:
    """The delayed history pins the `delayed-start` branch: code that no longer waits for
    runAt fails it, and only it (the other synthetic histories carry no runAt; the limit_wake
    one is left out: these copies define no signal handler, so its wake-up would be lost)."""
    records = synthetic("success", "retry", "fail", "cancel", "limit_wait", "delayed")
    failures = await replay_with([SyntheticNoDelay], records, changed_runner())
    delayed = [r.path.name for r in records if r.case == "delayed"]
    assert delayed and len(delayed) < len(records)
    assert_non_determinism(failures, delayed)
