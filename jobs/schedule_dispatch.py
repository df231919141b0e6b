"""The schedules' outbox dispatcher: makes Temporal match the `ai_schedule` rows.

A command (`db/schedules.py`) is claimed under a lease, applied outside any transaction, then
marked done (or put back with a backoff). Every application is idempotent, so a command applied
twice (a dispatcher died after Temporal answered) changes nothing:

- `sync` reads the row as it is now. No row: the Temporal schedule is deleted (already gone
  counts as done). A row: the schedule is created with the row's spec, policy and pause; if it
  exists, its pause is set to the row's. The row is read again afterwards and the pause applied
  again if it changed meanwhile, so two dispatchers applying two syncs of one schedule in either
  order leave Temporal as the row says.
- `trigger` starts one `ScheduledRun` with the trigger's time (workflow id from the schedule id
  and that time: "already started" counts as done), even while the schedule is paused.

Every `ai-system` worker process runs `run` under the supervisor; the API also dispatches a
schedule's commands right after its transaction commits (`dispatch(schedule_id)`), so Temporal
usually follows within the request; the loop is what makes it reliable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from datetime import timedelta

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
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from db import schedules as schedules_db
from db.schedules import CommandRow, ScheduleRow
from db.session import SessionMaker
from engine.definition import SYSTEM_QUEUE
from engine.schedules import (
    SCHEDULE_RUN_WORKFLOW,
    ScheduledRunInput,
    iso,
    run_workflow_id,
    temporal_schedule_id,
)
from engine.settings import Settings

log = logging.getLogger(__name__)
OVERLAP_POLICIES = {
    "skip": ScheduleOverlapPolicy.SKIP,
    "buffer_one": ScheduleOverlapPolicy.BUFFER_ONE,
    "allow_all": ScheduleOverlapPolicy.ALLOW_ALL,
}
LEASE_S = 30.0
BATCH = 20
# Finished commands are kept this long (for an operator's look), then deleted.
KEEP_DONE_S = 86_400.0
# How often a dispatcher checks that every schedule's Temporal schedule exists.
REPAIR_EVERY_S = 600.0
# How often the dispatcher looks for commands: an API's change of a schedule reaches Temporal
# within this, which no run waits on (the next fire is at least SCHEDULE_MIN_INTERVAL_S away).
POLL_S = 10.0
# How late a fire missed while Temporal was away may still run (Temporal's catch-up window):
# a minute covers a restart; a run hours late would come as a surprise, and the next fire is due.
CATCHUP_WINDOW_S = 60


class ScheduleDispatcher:
    def __init__(
        self, sessionmaker: SessionMaker, client: Client, settings: Settings, poll_s: float = POLL_S
    ) -> None:
        self._sm = sessionmaker
        self._client = client
        self._suffix = settings.task_queue_suffix
        self._queue = settings.task_queue(SYSTEM_QUEUE)
        self._catchup = timedelta(seconds=CATCHUP_WINDOW_S)
        self._poll_s = poll_s

    def temporal_id(self, schedule_id: object) -> str:
        return temporal_schedule_id(schedule_id, self._suffix)

    def schedule(self, row: ScheduleRow) -> Schedule:
        """The Temporal schedule of a row: its spec, overlap policy, catch-up window and pause;
        the action starts `ScheduledRun` with the schedule id only (no input, no owner)."""
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
                task_queue=self._queue,
            ),
            spec=spec,
            policy=SchedulePolicy(
                overlap=OVERLAP_POLICIES[row.overlap], catchup_window=self._catchup
            ),
            state=ScheduleState(paused=row.paused),
        )

    async def dispatch(self, schedule_id: uuid.UUID | None = None) -> int:
        """Claims due commands (only this schedule's, if given) and applies them; how many."""
        async with self._sm.begin() as s:
            rows = await schedules_db.claim_commands(
                s, limit=BATCH, lease_s=LEASE_S, schedule_id=schedule_id
            )
        synced: set[uuid.UUID] = set()
        for cmd in rows:
            try:
                if cmd.command == schedules_db.TRIGGER:
                    await self._trigger(cmd)
                elif cmd.schedule_id not in synced:
                    await self._sync(cmd.schedule_id)
                    synced.add(cmd.schedule_id)
            except Exception as exc:  # Temporal away or refusing: back off, try again
                delay = min(2.0 ** min(cmd.attempts, 6), 60.0)
                log.warning(
                    "schedule command failed",
                    extra={"command_id": cmd.id, "error": type(exc).__name__},
                )
                async with self._sm.begin() as s:
                    await schedules_db.put_back(
                        s, cmd.id, error=type(exc).__name__, retry_in_s=delay
                    )
                continue
            async with self._sm.begin() as s:
                await schedules_db.mark_applied(s, [cmd.id])
        return len(rows)

    async def _row(self, schedule_id: uuid.UUID) -> ScheduleRow | None:
        async with self._sm() as s:
            return await schedules_db.get(s, schedule_id)

    async def _sync(self, schedule_id: uuid.UUID) -> None:
        row = await self._row(schedule_id)
        handle = self._client.get_schedule_handle(self.temporal_id(schedule_id))
        if row is None:
            try:
                await handle.delete()
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
            return
        try:
            await self._client.create_schedule(self.temporal_id(row.id), self.schedule(row))
            applied = row.paused
        except ScheduleAlreadyRunningError:
            applied = not row.paused  # unknown: apply the row's pause below
        for _ in range(3):
            if applied != row.paused:
                if row.paused:
                    await handle.pause(note="paused")
                else:
                    await handle.unpause(note="resumed")
                applied = row.paused
            again = await self._row(schedule_id)
            if again is None:
                await self._sync(schedule_id)
                return
            if again.paused == applied:
                return
            row = again

    async def _trigger(self, cmd: CommandRow) -> None:
        if cmd.run_at is None or await self._row(cmd.schedule_id) is None:
            return
        with contextlib.suppress(WorkflowAlreadyStartedError):
            await self._client.start_workflow(
                SCHEDULE_RUN_WORKFLOW,
                ScheduledRunInput(str(cmd.schedule_id), manual_at=iso(cmd.run_at)),
                id=run_workflow_id(cmd.schedule_id, cmd.run_at, self._suffix),
                task_queue=self._queue,
            )

    async def repair(self, page: int = 100) -> int:
        """Creates again every Temporal schedule that is missing although its row exists (a
        Temporal server whose state was lost, a schedule deleted by hand); how many. Runs when
        the loop starts and then every REPAIR_EVERY_S."""
        repaired, after = 0, None
        while True:
            async with self._sm() as s:
                ids = await schedules_db.ids_after(s, after, page)
            for sid in ids:
                try:
                    await self._client.get_schedule_handle(self.temporal_id(sid)).describe()
                except RPCError as exc:
                    if exc.status != RPCStatusCode.NOT_FOUND:
                        raise
                    await self._sync(sid)
                    repaired += 1
            if len(ids) < page:
                return repaired
            after = ids[-1]

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop`: dispatch what is due, then wait POLL_S (less when a
        full batch suggests more); repair now and then. A database blip backs off here; the
        supervisor has the rest."""
        purge_every, polls = max(int(REPAIR_EVERY_S / self._poll_s), 1), -1
        while not stop.is_set():
            n = 0
            try:
                polls += 1
                if polls % purge_every == 0:
                    async with self._sm.begin() as s:
                        await schedules_db.purge_done(s, older_than_s=KEEP_DONE_S)
                    if await self.repair():
                        log.warning("missing Temporal schedules created again")
                n = await self.dispatch()
            except Exception as exc:
                log.warning("schedule dispatch failed", extra={"error": type(exc).__name__})
            if n >= BATCH:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._poll_s)
