"""Why a queued or running job is not progressing, computed live for the admin job view.

Two sources, in order: the job's `ai.job.enqueue` outbox event (SQL), then, once that event is
published, the job's workflow in Temporal. Temporal gets a short budget and any error there gives
no answer at all: the admin view must not fail, or hang, because Temporal does.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionResponse
from temporalio.service import RPCError, RPCStatusCode

from api.state import AppState
from db import jobs as jobs_db
from db.jobs import JobRow
from db.outbox import OutboxRow
from db.outbox_admin import enqueue_row_for_job
from engine.lifecycle import ACTIVE_VALUES
from engine.workflow_state import workflow_state

log = logging.getLogger(__name__)

ACTIVE = ACTIVE_VALUES
DESCRIBE_BUDGET_S = 2.0
_ERROR_IN_DETAIL = 200
_MISSING: Final = "missing"

Reason = Literal[
    "DEAD_ENQUEUE",
    "ENQUEUE_BACKING_OFF",
    "WORKFLOW_TASK_FAILING",
    "WORKFLOW_MISSING",
    "WORKFLOW_CLOSED",
]


@dataclass(frozen=True)
class Stuck:
    reason: Reason
    detail: str
    since: datetime | None


def _last_error(row: OutboxRow) -> str:
    if not row.last_error:
        return ""
    return f" Last error: {row.last_error[:_ERROR_IN_DETAIL]}"


def from_enqueue(row: OutboxRow) -> Stuck | None:
    """The enqueue event, before it is published. `since` is when the event was written: the job
    has waited for its workflow since then.

    A parked row is `DEAD_ENQUEUE`: `dead` used up its attempts (the reconciler sends it again,
    with a growing backoff, while the job waits; an operator's requeue does now), `failed` can
    never be dispatched as written (only an operator's requeue sends it again); `pending` after
    a failed attempt is retried on its own, with a backoff, as long as the job waits."""
    if row.status == "dead":
        return Stuck(
            "DEAD_ENQUEUE",
            f"Enqueue event {row.id} is dead after {row.attempt_count} attempt(s); the "
            "reconciler sends it again while the job waits, POST "
            f"/admin-api/ai/outbox/{row.id}/requeue does now.{_last_error(row)}",
            row.created_at,
        )
    if row.status == "failed":
        return Stuck(
            "DEAD_ENQUEUE",
            f"Enqueue event {row.id} failed: it can never be dispatched as written and is not "
            f"retried; POST /admin-api/ai/outbox/{row.id}/requeue sends it again."
            f"{_last_error(row)}",
            row.created_at,
        )
    if row.status == "pending" and row.attempt_count > 0:
        return Stuck(
            "ENQUEUE_BACKING_OFF",
            f"Enqueue event {row.id} failed {row.attempt_count} attempt(s); next attempt at "
            f"{row.available_at.isoformat()}.{_last_error(row)}",
            row.created_at,
        )
    return None


def from_workflow(desc: DescribeWorkflowExecutionResponse, job_status: str) -> Stuck | None:
    """The workflow of a job that SQL still calls queued or running.

    A workflow task that fails is retried by Temporal forever (a plain exception in workflow
    code, non-determinism after a bad deploy); only the pending task's attempt shows it. Temporal
    does not say when that streak began, hence no `since`."""
    state = workflow_state(desc)
    if state.running:
        if state.failing_task_attempts > 0:
            return Stuck(
                "WORKFLOW_TASK_FAILING",
                f"The workflow task failed and is at attempt {state.failing_task_attempts + 1}"
                "; the workflow cannot progress until its code is fixed (see the workflow's "
                "pending task in Temporal).",
                None,
            )
        return None
    return Stuck(
        "WORKFLOW_CLOSED",
        f"The workflow is {state.status} while the job is still {job_status}.",
        state.closed_at,
    )


async def _describe(
    state: AppState, workflow_id: str, job_id: str
) -> DescribeWorkflowExecutionResponse | Literal["missing"] | None:
    """The raw description, `missing`, or None when Temporal cannot answer within the budget
    (connecting included: the API's client is connected lazily)."""
    try:
        async with asyncio.timeout(DESCRIBE_BUDGET_S):
            client = await state.temporal_client(timeout_s=DESCRIBE_BUDGET_S)
            desc = await client.get_workflow_handle(workflow_id).describe(
                rpc_timeout=timedelta(seconds=DESCRIBE_BUDGET_S)
            )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return _MISSING
        log.warning("stuck check: describe failed (%s)", exc.status.name, extra={"job_id": job_id})
        return None
    except Exception as exc:  # timeout, Temporal down: no stuck info rather than a 5xx
        log.warning(
            "stuck check: Temporal unavailable (%s)", type(exc).__name__, extra={"job_id": job_id}
        )
        return None
    return desc.raw_description


async def stuck_for(state: AppState, job: JobRow) -> Stuck | None:
    """None for a terminal job, a job whose enqueue is simply waiting or being dispatched, a
    healthy workflow, or when Temporal cannot be asked."""
    if job.lifecycle_status not in ACTIVE:
        return None
    job_id = str(job.id)
    async with state.sessionmaker() as s:
        row = await enqueue_row_for_job(s, job_id)
    if row is None:
        return None
    if row.status != "published":
        return from_enqueue(row)

    desc = await _describe(state, job.workflow_id, job_id)
    if desc is None:
        return None
    if isinstance(desc, str):  # missing
        found: Stuck | None = Stuck(
            "WORKFLOW_MISSING",
            "The enqueue event was published but Temporal has no workflow "
            f"{job.workflow_id!r}; the reconciler re-sends such events.",
            row.published_at,
        )
    else:
        found = from_workflow(desc, job.lifecycle_status)
    if found is not None and found.reason in ("WORKFLOW_MISSING", "WORKFLOW_CLOSED"):
        # Race: the job row was read before Temporal was asked, and a workflow closes right after
        # the transaction that ends its job (PROJECT, or a cancel) commits. Read the job again:
        # if it has ended meanwhile, nothing is wrong.
        async with state.sessionmaker() as s:
            now = await jobs_db.get(s, job.id)
        if now is None or now.lifecycle_status not in ACTIVE:
            return None
    return found
