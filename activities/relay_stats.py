"""When the relay refreshes the queue tables' statistics (db/queue_stats.py): after a claim that
took `slow_s` or more, at most every `every_s` (a look that found nothing to refresh: again
after `RECHECK_S`), in a task of its own (the loop never waits for an ANALYZE). A fast claim
costs nothing; a slow one with statistics still current costs one read of
`pg_stat_user_tables`. A database that refuses ANALYZE (the engine's role does not own the
tables) is told once in the log and not asked again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from db import queue_stats
from db.errors import is_driver_error, is_insufficient_privilege
from db.session import SessionMaker

log = logging.getLogger(__name__)

# A claim this slow reads far more than its rows (a plan over stale statistics: about 8 ms at
# 500 waiting jobs with current ones, 27-94 ms without).
SLOW_CLAIM_S = 0.02
# At most one refresh per relay this often; rows changed since the last statistics, at least.
REFRESH_EVERY_S = 30.0
MIN_CHANGES = 200
# A slow claim whose tables had not changed enough (or whose changes the statistics system had
# not counted yet: each backend reports them at most once a second) looks again no sooner than
# this. A burst's first slow claims come before its creates are counted; each look while claims
# stay slow is one read of `pg_stat_user_tables`, so looking often costs little, and the burst's
# claims over stale statistics (40-80 ms each) end within about a second of its creates.
RECHECK_S = 0.5


class QueueStats:
    def __init__(
        self,
        sm: SessionMaker,
        *,
        slow_s: float = SLOW_CLAIM_S,
        every_s: float = REFRESH_EVERY_S,
        min_changes: int = MIN_CHANGES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sm = sm
        self._clock = clock
        self._slow_s, self._every_s, self._min_changes = slow_s, every_s, min_changes
        self._next = 0.0  # monotonic: no refresh before this
        self._task: asyncio.Task[None] | None = None
        self.refused = False
        self.analyzed: list[str] = []  # tables analyzed so far (tests, logs)

    def after_claim(self, took_s: float) -> None:
        """A claim took `took_s`: refresh in the background if it was slow and it is time."""
        now = self._clock()
        if (
            took_s < self._slow_s
            or self.refused
            or now < self._next
            or (self._task is not None and not self._task.done())
        ):
            return
        self._next = now + RECHECK_S
        self._task = asyncio.create_task(self._refresh(took_s), name="relay-queue-stats")

    async def _refresh(self, took_s: float) -> None:
        tables: list[str] = []
        try:
            for table in queue_stats.TABLES:  # one transaction each (db/queue_stats.py)
                async with self._sm.begin() as s:
                    if await queue_stats.refresh(s, table, min_changes=self._min_changes):
                        tables.append(table)
        except Exception as exc:
            if is_insufficient_privilege(exc):
                self.refused = True
                log.warning("cannot ANALYZE the queue tables (not their owner); not asked again")
            elif is_driver_error(exc) or isinstance(exc, OSError):
                log.warning("queue statistics not refreshed: %s", type(exc).__name__)
            else:
                raise
        finally:
            if tables:  # the ones analyzed before a failure count too
                self._next = self._clock() + self._every_s
                self.analyzed.extend(tables)
                log.info("analyzed %s after a claim of %.0f ms", ", ".join(tables), 1e3 * took_s)

    async def wait(self) -> None:
        """Until the refresh in progress (if any) has ended (tests)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
