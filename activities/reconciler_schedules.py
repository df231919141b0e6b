"""The reconciler's `schedules` phase: every Temporal schedule matches its `ai_schedule` row.

The relay applies each change of a schedule (its `ai.schedule.sync` event) as it happens; this
is the repair for what happened to Temporal meanwhile: a server whose state was wiped, a schedule
deleted or paused by hand in the UI, a schedule an older version made that starts its runs on
`ai-system` rather than `ai-schedules`. One sweep describes each row's Temporal schedule (one
call) and syncs those that differ (jobs/schedule_dispatch.py `ScheduleSync.repair`).

A sweep starts at most every REPAIR_EVERY_S in a process (the first pass after a worker starts
sweeps at once), and goes page by page within the phase's describes and time, keeping its
cursor: a sweep cut short goes on at the next pass until it wraps round. At its end, one list of
Temporal's schedules (a call per 1,000) finds those whose row is gone (a delete whose
`ai.schedule.sync` was parked `dead`) and deletes them.
"""

from __future__ import annotations

import logging
import time
import uuid

from temporalio.service import RPCError, RPCStatusCode

from activities.reconciler_pass import Pass, Phase
from db import schedules as schedules_db
from db.session import SessionMaker
from jobs.schedule_dispatch import ScheduleSync

log = logging.getLogger("activities.reconciler")
# How often a sweep starts (each costs a describe per schedule).
REPAIR_EVERY_S = 600.0
PAGE = 100
# Temporal away: the phase stops (and the sweep goes on from there at a later pass).
_AWAY = frozenset({RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED})


class ScheduleRepair:
    def __init__(
        self,
        sessionmaker: SessionMaker,
        sync: ScheduleSync | None,
        *,
        every_s: float = REPAIR_EVERY_S,
    ) -> None:
        self._sm = sessionmaker
        self._sync = sync
        self._every_s = every_s
        self._after: uuid.UUID | None = None  # mid-sweep: where the next page starts
        self._sweeping = False
        self._next_sweep = 0.0  # monotonic

    async def run(self, p: Pass, phase: Phase) -> None:
        """One pass's share of the sweep (nothing without a sync: a reconciler of no schedules)."""
        if self._sync is None:
            return
        if not self._sweeping:
            if time.monotonic() < self._next_sweep:
                return
            self._sweeping, self._after = True, None
        while True:
            async with self._sm() as s:
                ids = await schedules_db.ids_after(s, self._after, PAGE)
            for sid in ids:
                if phase.describes_left <= 0 or phase.out_of_time():
                    p.cut(phase)
                    return
                phase.describes_left -= 1
                p.temporal_calls += 1
                p.described += 1
                await self._repair(p, sid)
                self._after = sid
            p.beat()
            if len(ids) < PAGE:
                await self._orphans(p, phase)
                self._sweeping = False
                self._next_sweep = time.monotonic() + self._every_s
                return

    async def _orphans(self, p: Pass, phase: Phase) -> None:
        """Deletes the Temporal schedules whose row is gone, a page of ids at a time (a row
        never comes back: its id is random, and its Temporal schedule is only ever created
        after its row committed)."""
        assert self._sync is not None
        page: list[uuid.UUID] = []
        p.temporal_calls += 1
        async for sid in self._sync.listed():
            page.append(sid)
            if len(page) >= PAGE:
                await self._delete_orphans(p, page)
                page = []
                if phase.out_of_time():  # the rest at the next sweep
                    p.cut(phase)
                    return
        await self._delete_orphans(p, page)

    async def _delete_orphans(self, p: Pass, page: list[uuid.UUID]) -> None:
        if not page:
            return
        assert self._sync is not None
        async with self._sm() as s:
            alive = await schedules_db.existing(s, page)
        for sid in page:
            if sid not in alive:
                p.temporal_calls += 1
                await self._sync.sync(sid)  # no row: deleted
                p.add("schedule_orphan_deleted")
                p.details.append(f"schedule {sid} deleted")
                log.warning(
                    "Temporal schedule without its row deleted",
                    extra={"schedule_id": str(sid), "alert": "AIJOBS_SCHEDULE_REPAIRED"},
                )

    async def _repair(self, p: Pass, sid: uuid.UUID) -> None:
        """One schedule; a refusal of Temporal's about this one (not an outage) is logged and
        the sweep goes on, so one bad schedule never holds back the others."""
        assert self._sync is not None
        try:
            synced = await self._sync.repair(sid)
        except RPCError as exc:
            if exc.status in _AWAY:
                raise
            p.add("schedule_repair_failed")
            log.warning(
                "Temporal schedule repair failed",
                extra={"schedule_id": str(sid), "error": exc.status.name if exc.status else ""},
            )
            return
        if synced:
            p.temporal_calls += 2
            p.add("schedule_synced")
            p.details.append(f"schedule {sid} synced")
            log.warning(
                "Temporal schedule did not match its row; synced",
                extra={"schedule_id": str(sid), "alert": "AIJOBS_SCHEDULE_REPAIRED"},
            )
