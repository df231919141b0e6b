"""A schedule's side of Temporal: what the relay does with the schedule's outbox events, and the
reconciler's repair.

The schedule row is the truth; its changes are outbox events (db/schedules.py) that the relay
dispatches here, outside any transaction. Every application is idempotent, so an event applied
twice (a relay died after Temporal answered) changes nothing:

- `sync` reads the row as it is now. No row: the Temporal schedule is deleted (already gone
  counts as done). A row: the schedule is created from it, or, if it exists, updated to it
  (spec, overlap, catch-up window, pause, and the action: `ScheduledRun` on `ai-schedules`).
  The update reads the row again inside Temporal's conflict loop, so two syncs of one schedule
  applied in either order leave Temporal as the row says.
- `trigger` starts one `ScheduledRun` with the trigger's time (workflow id from the schedule id
  and that time: "already started" counts as done), even while the schedule is paused.

`repair` is the reconciler's look at one schedule: missing in Temporal, paused otherwise than
the row, or starting its runs on another task queue (an older version's `ai-system`): synced.
`listed` names the schedules Temporal holds for this deployment, so that the reconciler deletes
those whose row is gone (a delete whose sync was parked).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from db import schedules as schedules_db
from db.schedules import ScheduleRow
from db.session import SessionMaker
from engine.schedules import (
    SCHEDULE_RUN_WORKFLOW,
    SCHEDULES_QUEUE,
    ScheduledRunInput,
    iso,
    run_workflow_id,
    temporal_schedule_id,
)

OVERLAP_POLICIES = {
    "skip": ScheduleOverlapPolicy.SKIP,
    "buffer_one": ScheduleOverlapPolicy.BUFFER_ONE,
    "allow_all": ScheduleOverlapPolicy.ALLOW_ALL,
}

# How late a fire missed while Temporal was away may still run (Temporal's catch-up window):
# a minute covers a restart; a run hours late would come as a surprise, and the next fire is due.
CATCHUP_WINDOW_S = 60


class MalformedEvent(ValueError):
    """A schedule event whose payload names no schedule (or no time): it can never be applied."""


class ScheduleSync:
    def __init__(
        self, sessionmaker: SessionMaker, client: Client, *, suffix: str, catchup_s: float
    ) -> None:
        self._sm = sessionmaker
        self._client = client
        self._suffix = suffix
        self.queue = f"{SCHEDULES_QUEUE}{suffix}"
        self._catchup = timedelta(seconds=catchup_s)

    def temporal_id(self, schedule_id: object) -> str:
        return temporal_schedule_id(schedule_id, self._suffix)

    def schedule(self, row: ScheduleRow) -> Schedule:
        """The Temporal schedule of a row: its spec, overlap policy, catch-up window and pause;
        the action starts `ScheduledRun` on `ai-schedules` with the schedule id only (no input,
        no owner)."""
        spec = ScheduleSpec(
            intervals=(
                [ScheduleIntervalSpec(every=timedelta(seconds=row.interval_s))]
                if row.interval_s is not None
                else []
            ),
            cron_expressions=[row.cron] if row.cron is not None else [],
            time_zone_name=row.timezone,
            start_at=row.start_at,
            end_at=row.end_at,
        )
        return Schedule(
            action=ScheduleActionStartWorkflow(
                SCHEDULE_RUN_WORKFLOW,
                ScheduledRunInput(str(row.id)),
                id=self.temporal_id(row.id),
                task_queue=self.queue,
            ),
            spec=spec,
            policy=SchedulePolicy(
                overlap=OVERLAP_POLICIES[row.overlap], catchup_window=self._catchup
            ),
            state=ScheduleState(paused=row.paused, note="paused" if row.paused else None),
        )

    async def dispatch(self, sync: bool, payload: object) -> None:
        """Applies one outbox event (`sync` or else `trigger`); raises what Temporal raised,
        or MalformedEvent."""
        p = payload if isinstance(payload, dict) else {}
        try:
            schedule_id = uuid.UUID(str(p["scheduleId"]))
            at = None if sync else datetime.fromisoformat(str(p["scheduledAt"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedEvent("malformed schedule event payload") from exc
        if at is None:
            await self.sync(schedule_id)
        else:
            await self.trigger(schedule_id, at)

    async def _row(self, schedule_id: uuid.UUID) -> ScheduleRow | None:
        async with self._sm() as s:
            return await schedules_db.get(s, schedule_id)

    async def sync(self, schedule_id: uuid.UUID) -> None:
        row = await self._row(schedule_id)
        handle = self._client.get_schedule_handle(self.temporal_id(schedule_id))
        if row is None:
            await self._delete(schedule_id)
            return
        try:
            await self._client.create_schedule(self.temporal_id(row.id), self.schedule(row))
        except ScheduleAlreadyRunningError:
            await handle.update(self._update(schedule_id))
        # A change committed while the schedule was created (its own sync may have found
        # nothing to update yet): the row as it is now wins.
        again = await self._row(schedule_id)
        if again is None:
            await self._delete(schedule_id)
        elif again != row:
            await handle.update(self._update(schedule_id))

    def _update(
        self, schedule_id: uuid.UUID
    ) -> Callable[[ScheduleUpdateInput], Awaitable[ScheduleUpdate | None]]:
        async def updater(_: ScheduleUpdateInput) -> ScheduleUpdate | None:
            # Called in Temporal's conflict loop: each call reads the row again.
            row = await self._row(schedule_id)
            return ScheduleUpdate(schedule=self.schedule(row)) if row is not None else None

        return updater

    async def _delete(self, schedule_id: uuid.UUID) -> None:
        try:
            await self._client.get_schedule_handle(self.temporal_id(schedule_id)).delete()
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise

    async def trigger(self, schedule_id: uuid.UUID, at: datetime) -> None:
        """One `ScheduledRun` at `at`, paused or not; nothing for a schedule deleted since."""
        if await self._row(schedule_id) is None:
            return
        with contextlib.suppress(WorkflowAlreadyStartedError):
            await self._client.start_workflow(
                SCHEDULE_RUN_WORKFLOW,
                ScheduledRunInput(str(schedule_id), manual_at=iso(at)),
                id=run_workflow_id(schedule_id, at, self._suffix),
                task_queue=self.queue,
            )

    async def repair(self, schedule_id: uuid.UUID) -> bool:
        """Describes the schedule's Temporal schedule and syncs it when it is missing, paused
        otherwise than its row, or starts runs on another task queue; whether it synced."""
        try:
            desc = await self._client.get_schedule_handle(self.temporal_id(schedule_id)).describe()
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            desc = None
        row = await self._row(schedule_id)
        if row is None:
            return False  # deleted meanwhile: its own sync removes the Temporal schedule
        if desc is not None:
            action = desc.schedule.action
            queue = action.task_queue if isinstance(action, ScheduleActionStartWorkflow) else None
            if queue == self.queue and desc.schedule.state.paused == row.paused:
                return False
        await self.sync(schedule_id)
        return True

    async def listed(self) -> AsyncIterator[uuid.UUID]:
        """The schedule ids of this deployment's Temporal schedules (`aijobs-schedule:{id}` plus
        its suffix; another deployment's, with another suffix, never parse as one). Temporal's
        list is eventually consistent: a schedule created a moment ago may be missing."""
        prefix = temporal_schedule_id("")
        async for entry in await self._client.list_schedules():
            sid = entry.id
            if not sid.startswith(prefix) or not sid.endswith(self._suffix):
                continue
            try:
                yield uuid.UUID(sid[len(prefix) : len(sid) - len(self._suffix)])
            except ValueError:
                continue
