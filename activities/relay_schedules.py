"""The relay's dispatch of a schedule's outbox events (`ai.schedule.sync`,
`ai.schedule.trigger`): applied to Temporal by jobs/schedule_dispatch.py, each outcome settled
as any row's (published; or backed off and parked by the outbox's rules, never lost)."""

from __future__ import annotations

from temporalio.service import RPCError

from activities.relay_failures import DispatchFailure, rpc_failure
from db.outbox import OutboxRow
from engine.schedules import SYNC_EVENT
from jobs.schedule_dispatch import MalformedEvent, ScheduleSync


async def dispatch_schedule_event(sync: ScheduleSync, row: OutboxRow) -> DispatchFailure | None:
    """None once Temporal matches the event; a malformed payload is `failed` at once."""
    try:
        await sync.dispatch(row.event_type == SYNC_EVENT, row.payload)
    except MalformedEvent as exc:
        return DispatchFailure("malformed", str(exc))
    except RPCError as exc:
        return rpc_failure(exc)
    return None
