"""What the engine needs to know of a job's workflow in Temporal, read from its description: does
it exist, is it running, is its workflow task failing (retried forever by Temporal after a plain
exception in workflow code or a non-determinism error), and, once closed, how and when. The
reconciler and the admin job view (`api/stuck.py`) classify a workflow with this one function."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionResponse

RUNNING = WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING


@dataclass(frozen=True)
class WorkflowState:
    exists: bool
    running: bool
    # Failed tries of the pending workflow task (its attempt counts from 1); 0 when not running.
    failing_task_attempts: int = 0
    # Temporal's status without its prefix (RUNNING, COMPLETED, TERMINATED...); "" when missing.
    status: str = ""
    closed_at: datetime | None = None


MISSING = WorkflowState(exists=False, running=False)


def workflow_state(desc: DescribeWorkflowExecutionResponse) -> WorkflowState:
    info = desc.workflow_execution_info
    running = info.status == RUNNING
    attempts = 0
    if running and desc.HasField("pending_workflow_task"):
        attempts = max(0, desc.pending_workflow_task.attempt - 1)
    return WorkflowState(
        exists=True,
        running=running,
        failing_task_attempts=attempts,
        status=_status_name(info.status),
        closed_at=info.close_time.ToDatetime(tzinfo=UTC) if info.HasField("close_time") else None,
    )


def _status_name(status: WorkflowExecutionStatus.ValueType) -> str:
    """A status this SDK does not know (a newer server) is shown by number, never raises."""
    try:
        name = WorkflowExecutionStatus.Name(status)
    except ValueError:
        return str(status)
    return name.removeprefix("WORKFLOW_EXECUTION_STATUS_")
