"""What the outbox relay does with each claimed row, by event type (docs/architecture.md).

`Dispatch.table` maps an event type to the coroutine that acts on a row of it: an enqueue starts
its job's workflow, a bulk start the admin operation's workflow, a schedule's sync or trigger
its Temporal schedule; a job's domain events are
acknowledged (published, their webhook deliveries fanned out by the publish). A new kind of
outbox event is one entry here (and its insert NOTIFYing `ai_outbox`). Every dispatch is
idempotent: a row dispatched twice after a crash starts its workflow once ("already started"
counts as success). Nothing here runs inside a transaction, and no dispatch raises: each row
gets its own outcome (`None`, or a `DispatchFailure` saying how the row goes back).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from temporalio.client import Client
from temporalio.common import (
    Priority,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from activities.metrics import WorkerMetrics
from activities.relay_due import lag_s, still_ahead
from activities.relay_failures import DispatchFailure, rpc_failure
from activities.relay_schedules import dispatch_schedule_event
from db.bulk import BULK_START
from db.outbox import CANCELLED, COMPLETED, ENQUEUE, FAILED, OutboxRow, enqueue_dedupe_key
from db.session import SessionMaker
from engine import search_attributes
from engine.contracts import (
    BULK_WORKFLOW,
    BulkInput,
    JobWorkflowInput,
    bulk_workflow_id,
    workflow_id,
)
from engine.definition import QUEUE_NAMES, SYSTEM_QUEUE, priority_key
from engine.schedules import SCHEDULE_EVENTS
from jobs.schedule_dispatch import CATCHUP_WINDOW_S, ScheduleSync
from jobs.spec import Catalog

if TYPE_CHECKING:
    from activities.relay import RelayConfig

log = logging.getLogger(__name__)
# Domain events with no subscriber in this process: published (acknowledged), not dispatched.
KNOWN_DOMAIN_EVENTS = frozenset({COMPLETED, FAILED, CANCELLED})

Dispatcher = Callable[[OutboxRow], Awaitable["DispatchFailure | None"]]


class Dispatch:
    """The relay's dispatch table over its Temporal client, at most `max_in_flight` starts at
    once; `started` counts the job workflows it started (tests, the heartbeat)."""

    def __init__(
        self,
        sessionmaker: SessionMaker,
        client: Client,
        catalog: Catalog,
        config: RelayConfig,
        metrics: WorkerMetrics,
    ) -> None:
        self._client = client
        self._catalog = catalog
        self.config = config
        self._metrics = metrics
        self._sem = asyncio.Semaphore(config.max_in_flight)
        self._schedules = ScheduleSync(
            sessionmaker, client, suffix=config.task_queue_suffix, catchup_s=CATCHUP_WINDOW_S
        )
        self.started = 0
        self.table: dict[str, Dispatcher] = {
            ENQUEUE: self.start_job,
            BULK_START: self.start_bulk,
            **dict.fromkeys(SCHEDULE_EVENTS, self.schedule_event),
            **dict.fromkeys(KNOWN_DOMAIN_EVENTS, _acknowledged),
        }

    async def row(self, row: OutboxRow) -> DispatchFailure | None:
        dispatcher = self.table.get(row.event_type)
        if dispatcher is None:
            log.warning(
                "unknown outbox event type; marked published, not dispatched",
                extra={"event_id": row.id, "event_type": row.event_type[:64]},
            )
            return None
        return await dispatcher(row)

    async def start_job(self, row: OutboxRow) -> DispatchFailure | None:
        """Start the job's workflow `<jobType>` with id `{queueName}:{jobType}:{jobId}` on the
        job's task queue, its search attributes, the job type's priority and the user's
        fairness key."""
        p = row.payload if isinstance(row.payload, dict) else {}
        cfg = self.config
        try:
            job_id = str(uuid.UUID(str(p["jobId"])))
            job_type = str(p["jobType"])
            queue = str(p["queueName"])
            fairness_key = str(p.get("fairnessKey") or "")[:64] if cfg.fairness else ""
            fairness_weight = float(p.get("fairnessWeight") or 1.0)
            user_active = int(p.get("userActive") or 0)
        except (KeyError, TypeError, ValueError):
            return DispatchFailure("malformed", "malformed enqueue payload")
        if queue not in QUEUE_NAMES:
            return DispatchFailure("malformed", f"unknown queueName {queue[:64]!r}")
        if 0 < user_active <= cfg.light_jobs:
            fairness_weight *= cfg.light_boost
        if job_type not in self._catalog:
            # Possibly a newer job type than this relay knows (a rolling deploy): retried, and
            # revived by the reconciler while the job waits.
            return DispatchFailure("retry", f"unknown jobType {job_type[:64]!r}")
        # The job type's own priority, set by the operator, never the client's: Temporal
        # orders priority keys before fairness keys across every user, so a client's urgency
        # would jump other users' jobs. A user's own jobs are ordered by the client's priority
        # before they get here (the dispatch window, db/relay.py).
        type_priority = self._catalog.get(job_type).definition.queue.default_priority
        async with self._sem:
            try:
                await self._client.start_workflow(
                    job_type,
                    JobWorkflowInput(
                        jobId=job_id,
                        jobType=job_type,
                        # Derived from the job id: no user id or client key reaches Temporal.
                        idempotencyKey=enqueue_dedupe_key(job_id),
                        createdAt=row.created_at.isoformat(),
                        runAt=still_ahead(p.get("runAt")),
                    ),
                    id=workflow_id(queue, job_type, job_id),
                    task_queue=f"{queue}{cfg.task_queue_suffix}",
                    # A closed run that failed, was terminated or timed out may be replaced by a
                    # fresh one (the reconciler re-enqueues a queued job whose run died); a
                    # completed run is never started twice, a running one is reused.
                    id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    search_attributes=TypedSearchAttributes(
                        [
                            SearchAttributePair(search_attributes.JOB_ID, job_id),
                            SearchAttributePair(search_attributes.JOB_TYPE, job_type),
                            SearchAttributePair(search_attributes.LIFECYCLE_STATUS, "queued"),
                        ]
                    ),
                    # Activities inherit it: EXECUTE waits for a slot in the job types'
                    # priority order, and within one fairly across users (by their weights).
                    priority=Priority(
                        priority_key=priority_key(type_priority),
                        fairness_key=fairness_key or None,
                        fairness_weight=fairness_weight if fairness_key else None,
                    ),
                )
                self.started += 1
                self._metrics.relay_lagged(queue, lag_s(row))
            except WorkflowAlreadyStartedError:
                pass  # it ran already: at-least-once delivery, exactly-once start
            except RPCError as exc:
                return rpc_failure(exc)
            except Exception as exc:
                return DispatchFailure("retry", f"{type(exc).__name__}: {str(exc)[:300]}")
        return None

    async def start_bulk(self, row: OutboxRow) -> DispatchFailure | None:
        """Start an admin bulk operation's workflow on `ai-system` (docs/admin.md). Its id is
        the operation's: a second start reuses a running one and never reruns a closed one."""
        p = row.payload if isinstance(row.payload, dict) else {}
        try:
            inp = BulkInput(
                operation_id=str(uuid.UUID(str(p["operationId"]))),
                action=str(p["action"]),
                page_size=int(p["pageSize"]),
                jobs_per_second=float(p["jobsPerSecond"]),
            )
        except (KeyError, TypeError, ValueError):
            return DispatchFailure("malformed", "malformed bulk start payload")
        async with self._sem:
            try:
                await self._client.start_workflow(
                    BULK_WORKFLOW,
                    inp,
                    id=bulk_workflow_id(inp.operation_id),
                    task_queue=f"{SYSTEM_QUEUE}{self.config.task_queue_suffix}",
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                )
            except WorkflowAlreadyStartedError:
                pass
            except RPCError as exc:
                return rpc_failure(exc)
        return None

    async def schedule_event(self, row: OutboxRow) -> DispatchFailure | None:
        """A schedule's change (`ai.schedule.sync`, `ai.schedule.trigger`) applied to its
        Temporal schedule (jobs/schedule_dispatch.py)."""
        async with self._sem:
            return await dispatch_schedule_event(self._schedules, row)


async def _acknowledged(row: OutboxRow) -> DispatchFailure | None:
    """A job's domain event: nothing to start; its publish fans out the webhook deliveries."""
    return None


def event_label(event_type: str) -> str:
    return event_type if event_type == ENQUEUE or event_type in KNOWN_DOMAIN_EVENTS else "other"
