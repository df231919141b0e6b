"""What the replay tests share: the recorded histories (`tests.replay.record` wrote them), the
replay through the workers' workflow classes and sandbox, and readers of a history's commands
(its activities, markers, signals, EXECUTE results)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from engine.payloads import DATA_CONVERTER
from runtime.worker import sandbox_runner
from runtime.workflow_runner import ContextFreeRunner
from tests.replay import HISTORIES
from workflows.batch import BatchWorkflow
from workflows.job_workflow import JobWorkflow
from workflows.system import ReconcilerWorkflow, RelayShardWorkflow

NAME = re.compile(r"^(?P<workflow>[a-z_]+)-v(?P<tag>[0-9]+)-(?P<case>[a-z_]+)\.json$")


# The baseline: the first tag recorded from the one shape of the workflows, without a patch
# (docs/versioning.md). Tags after it are recorded with `record --only` or in full.
BASELINE_TAG = 8


@dataclass(frozen=True)
class Recorded:
    path: Path
    workflow: str  # job type, "ai_batch" or "reconciler"
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


async def replay_with(
    workflows: list[type], records: Sequence[Recorded], runner: WorkflowRunner
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


def changed_runner() -> WorkflowRunner:
    """The workers' runner, whose sandbox must also pass the test modules through: they define
    the changed classes and import pytest."""
    workers = sandbox_runner()
    sandbox = SandboxedWorkflowRunner(
        restrictions=workers.inner.restrictions.with_passthrough_modules("tests")
    )
    return ContextFreeRunner(sandbox, DATA_CONVERTER)


# Every synthetic history: the plain shape's four endings, its branches and flow control's.
SYNTHETIC_CASES = (
    "success",
    "retry",
    "fail",
    "cancel",
    "limit_wait",
    "limit_wake",
    "delayed",
    "deadline",
    "ttl_admitted",
    "paused",
)


def synthetic(*cases: str) -> list[Recorded]:
    return [r for r in recorded() if r.workflow == "synthetic" and r.case in cases]


def assert_non_determinism(failures: dict[str, Exception], names: list[str]) -> None:
    assert sorted(failures) == sorted(names)
    for name, exc in failures.items():
        assert isinstance(exc, workflow.NondeterminismError), (name, repr(exc))


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


def current_workflows() -> list[type]:
    """What the workers register: a workflow per job type, the batch tier's `ai_batch`, the
    relay shards and the reconciler."""
    return [JobWorkflow, BatchWorkflow, RelayShardWorkflow, ReconcilerWorkflow]


async def replay(workflows: list[type], records: Sequence[Recorded]) -> dict[str, Exception]:
    """Replay failures by file name (empty: every history replayed)."""
    return await replay_with(workflows, records, sandbox_runner())


def workflow_type(r: Recorded) -> str:
    first = r.history.events[0]
    return str(first.workflow_execution_started_event_attributes.workflow_type.name)


def holds(needle: str, history_json: str) -> bool:
    """Whether a history holds `needle`: in its JSON text, or inside a payload (the JSON holds
    payload data base64-encoded, the protobuf encoding holds it verbatim)."""
    raw = History(events=WorkflowHistory.from_json("x", history_json).events).SerializeToString()
    return needle in history_json or needle.encode() in raw
