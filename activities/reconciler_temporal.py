"""The reconciler's questions to Temporal, each one counted in the pass that asks it
(activities/reconciler.py): a describe (the authority on one workflow), a visibility list
(which of a page of workflows run, in one call), and, for a run that closed failed, the tail of
its history (did a finalizer give up?).

Visibility is eventually consistent, so it only ever spares a describe: a workflow it does not
list is described before anything is done about it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import timedelta

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import (
    DescribeWorkflowExecutionRequest,
    GetWorkflowExecutionHistoryReverseRequest,
    ListWorkflowExecutionsRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.reconciler_pass import Pass
from engine.contracts import FINALIZE_CANCELLED, FINALIZE_FAILED
from engine.workflow_state import MISSING, WorkflowState, workflow_state

RPC_TIMEOUT = timedelta(seconds=10)

# Workflow ids this engine makes ("{queue}:{jobType}:{jobId}", the relay's, the reconciler's):
# only ids of this shape go into a visibility query; any other is described instead.
_QUERYABLE_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,255}$")


async def describe(client: Client, p: Pass, workflow_id: str) -> WorkflowState:
    """The workflow's state by Temporal's own word; MISSING when it does not exist."""
    p.temporal_calls += 1
    p.described += 1
    try:
        desc = await client.workflow_service.describe_workflow_execution(
            _describe_request(client.namespace, workflow_id), timeout=RPC_TIMEOUT
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return MISSING
        raise
    return workflow_state(desc)


async def running_among(client: Client, p: Pass, workflow_ids: Sequence[str]) -> set[str]:
    """Which of these workflows visibility lists as running: one list call per page of
    ids (two if the server pages the answer). Ids of an unexpected shape are left out (never
    listed, so described by the caller)."""
    ids = sorted({w for w in workflow_ids if _QUERYABLE_ID.match(w)})
    if not ids:
        return set()
    query = (
        "ExecutionStatus = 'Running' AND WorkflowId IN (" + ", ".join(f"'{w}'" for w in ids) + ")"
    )
    running: set[str] = set()
    token = b""
    while True:
        p.temporal_calls += 1
        resp = await client.workflow_service.list_workflow_executions(
            ListWorkflowExecutionsRequest(
                namespace=client.namespace,
                page_size=len(ids),
                next_page_token=token,
                query=query,
            ),
            timeout=RPC_TIMEOUT,
        )
        running.update(e.execution.workflow_id for e in resp.executions)
        token = resp.next_page_token
        # A full page may come with a token for an empty next one: one open run per id.
        if not token or len(running) >= len(ids):
            return running


FINALIZERS = frozenset({FINALIZE_FAILED, FINALIZE_CANCELLED})
_LOCAL_ACTIVITY_MARKER = "core_local_activity"
# Events read back from a run's close to find its last failed local activity: the finalizer's
# marker is recorded in the workflow task that closes the run, right before the close event.
_TAIL_EVENTS = 32


async def failed_finalizer(client: Client, p: Pass, workflow_id: str) -> str | None:
    """The finalizer whose failure closed the workflow's latest run, or None: the run did not
    close failed, or not in a finalizer. A failed local activity fails the workflow as its own
    ApplicationError, so the close event does not name it; the marker the local activity left
    does (its `data` names the activity type, its `failure` says it failed). One call, reading
    the run's history backwards from its close."""
    p.temporal_calls += 1
    resp = await client.workflow_service.get_workflow_execution_history_reverse(
        GetWorkflowExecutionHistoryReverseRequest(
            namespace=client.namespace,
            execution=WorkflowExecution(workflow_id=workflow_id),
            maximum_page_size=_TAIL_EVENTS,
        ),
        timeout=RPC_TIMEOUT,
    )
    events = list(resp.history.events)
    if not events or events[0].event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
        return None
    for event in events[1:]:
        name = _failed_local_activity(event)
        if name is not None:
            return name if name in FINALIZERS else None
    return None


def _failed_local_activity(event: HistoryEvent) -> str | None:
    """The activity type of a local activity's marker that records a failure, else None."""
    if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
        return None
    marker = event.marker_recorded_event_attributes
    if marker.marker_name != _LOCAL_ACTIVITY_MARKER or not marker.HasField("failure"):
        return None
    payloads = marker.details["data"].payloads if "data" in marker.details else []
    try:
        data = json.loads(payloads[0].data) if payloads else {}
    except ValueError:
        return None
    name = data.get("activity_type") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


def _describe_request(namespace: str, workflow_id: str) -> DescribeWorkflowExecutionRequest:
    return DescribeWorkflowExecutionRequest(
        namespace=namespace, execution=WorkflowExecution(workflow_id=workflow_id)
    )
