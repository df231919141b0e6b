"""The synthetic path (docs/architecture.md), in process: create → relay → workflow → succeeded."""

from __future__ import annotations

from temporalio.client import WorkflowExecutionStatus

from engine.contracts import JobWorkflowResult
from tests.stack import Stack


async def test_synthetic_job_succeeds_end_to_end(stack: Stack) -> None:
    job_id = await stack.create(input={"echo": {"n": 1}})
    row = await stack.wait_status(job_id, "succeeded", "failed", timeout=30)
    assert row.lifecycle_status == "succeeded", row.error_code
    assert row.status == "completed"
    assert row.progress == 100
    assert row.output == {"ok": True, "echo": {"n": 1}}
    assert row.output_hash and len(row.output_hash) == 64
    handle = stack.client.get_workflow_handle(
        stack.workflow_id(job_id), result_type=JobWorkflowResult
    )
    result = await handle.result()  # SQL says succeeded at PROJECT; COMPLETE may still run
    assert result.lifecycle_status == "succeeded"
    desc = await handle.describe()
    assert desc.status == WorkflowExecutionStatus.COMPLETED
    assert desc.workflow_type == "synthetic"
