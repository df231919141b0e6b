"""How the admin job view's `stuck` member classifies a job without a server: from its workflow's
description (a failing workflow task, a closed workflow) and from its enqueue outbox row. The
view over real HTTP is tests/e2e/test_admin_outbox.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.api.workflow.v1 import PendingWorkflowTaskInfo, WorkflowExecutionInfo
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionResponse

from api.stuck import from_enqueue, from_workflow
from db.outbox import ENQUEUE, OutboxRow


def _described(
    status: WorkflowExecutionStatus.ValueType, *, task_attempt: int | None = None
) -> DescribeWorkflowExecutionResponse:
    info = WorkflowExecutionInfo(status=status)
    if status != WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING:
        ts = Timestamp()
        ts.FromDatetime(datetime(2025, 1, 2, 3, 4, 5))
        info.close_time.CopyFrom(ts)
    desc = DescribeWorkflowExecutionResponse(workflow_execution_info=info)
    if task_attempt is not None:
        desc.pending_workflow_task.CopyFrom(PendingWorkflowTaskInfo(attempt=task_attempt))
    return desc


def test_workflow_classification() -> None:
    running = WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING
    assert from_workflow(_described(running), "running") is None
    assert from_workflow(_described(running, task_attempt=1), "queued") is None
    failing = from_workflow(_described(running, task_attempt=7), "running")
    assert failing is not None and failing.reason == "WORKFLOW_TASK_FAILING"
    assert "attempt 7" in failing.detail
    for status, name in (
        (WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_COMPLETED, "COMPLETED"),
        (WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_TERMINATED, "TERMINATED"),
        (WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_TIMED_OUT, "TIMED_OUT"),
    ):
        closed = from_workflow(_described(status), "queued")
        assert closed is not None and closed.reason == "WORKFLOW_CLOSED"
        assert name in closed.detail and "queued" in closed.detail
        assert closed.since == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_enqueue_classification() -> None:
    now = datetime.now(UTC)

    def row(status: str, attempts: int) -> OutboxRow:
        return OutboxRow(
            id=1,
            event_type=ENQUEUE,
            aggregate_type="AiJob",
            aggregate_id="j",
            dedupe_key="k",
            payload={},
            status=status,
            attempt_count=attempts,
            available_at=now + timedelta(seconds=30),
            locked_by=None,
            locked_at=None,
            last_error="x" * 5000,
            published_at=None,
            created_at=now,
        )

    assert from_enqueue(row("pending", 0)) is None
    assert from_enqueue(row("processing", 1)) is None
    assert from_enqueue(row("published", 1)) is None
    for status, reason in (
        ("dead", "DEAD_ENQUEUE"),  # attempts used up; the reconciler revives it
        ("failed", "DEAD_ENQUEUE"),  # never dispatchable: only an operator sends it again
        ("pending", "ENQUEUE_BACKING_OFF"),  # after a failed attempt
    ):
        s = from_enqueue(row(status, 3))
        assert s is not None and (s.reason, s.since) == (reason, now), (status, s)
        assert "x" * 200 in s.detail and len(s.detail) < 500  # the error is quoted, cut short
