"""When the outbox relay (activities/relay.py) claims, publishes or sleeps.

The relay's wake-ups come from its process's listener (db/listener.py) through two handlers,
which only record what they heard:
- `ai_outbox` (a create's enqueue, a requeue, a bulk start, a job event someone waits for), or
  MISSED on any channel (a (re)connect: notifications may have been lost): claim.
- `ai_job_changed` (every job state change): claim only while the last claim left enqueue rows
  held by their users' dispatch windows (a job's end may make room), and not before
  `job_wake_s` after the last claim; otherwise it costs nothing.
Besides them: the poll (`RELAY_POLL_INTERVAL_S`, the backstop), the next due time the last claim
read (a delayed job's runAt, a backing-off row's retry: db/relay.py `NEXT_DUE`, so a delayed job
starts at its time without a poll per job), a row the relay failed to dispatch coming due again,
and the publish of dispatched rows that no claim carried yet.

A wake-up heard while a claim is in flight is kept for the next one: its row may have committed
after the claim's snapshot was taken, and clearing it with the claim's own would leave that row
for the poll (a burst's last creates waited the whole poll interval).

Claims come at most every `claim_every_s`: one after a quiet spell goes at once (a lone create
is claimed the moment its NOTIFY arrives), while a burst of creates goes out in a few claims
instead of one each. A dispatched batch is marked published by the next claim's transaction
(one round trip for both), or on its own once `publish_within_s` has passed without a claim.
Nothing here holds an `ai_outbox` wake-up back behind a job change.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Action = Literal["claim", "publish"]


@dataclass(frozen=True)
class WakeTimes:
    poll_interval_s: float = 30.0
    job_wake_s: float = 0.2
    claim_every_s: float = 0.05
    publish_within_s: float = 0.1


@dataclass
class Wake:
    times: WakeTimes
    kick: asyncio.Event = field(default_factory=asyncio.Event)
    claim_now: bool = True  # an outbox NOTIFY (or a possible miss) since the last claim
    job_changed: bool = False  # a job changed since the last claim, while rows were held
    holding: bool = False  # the last claim left enqueue rows held by their windows
    last_claim: float = 0.0  # monotonic
    retry_at: float | None = None  # a row this relay failed comes due again
    due_at: float | None = None  # the next due time the last claim read (monotonic)
    paused_until: float = 0.0  # Temporal unreachable: no claim before this
    publish_due: float | None = None  # dispatched rows wait for their mark until this
    # Wake-ups heard so far (outbox, job changes while held): a claim notes them at its start.
    heard: tuple[int, int] = (0, 0)
    _poll_at: float = 0.0

    # ---- the listener's handlers --------------------------------------------------------------

    def on_outbox(self, payload: str | None) -> None:
        """`ai_outbox`, or MISSED on any channel: claim."""
        self.claim_now = True
        self.heard = (self.heard[0] + 1, self.heard[1])
        self.kick.set()

    def on_job_changed(self, payload: str | None) -> None:
        if payload is None:
            self.on_outbox(payload)
        elif self.holding:  # else nothing waits for room: the change costs nothing
            self.job_changed = True
            self.heard = (self.heard[0], self.heard[1] + 1)
            self.kick.set()

    # ---- decisions --------------------------------------------------------------------------

    def claimed(
        self,
        now: float,
        holding: bool,
        due_in_s: float | None = None,
        heard: tuple[int, int] | None = None,
    ) -> None:
        """A claim at `now`; `due_in_s`: seconds to the next due time it read (None: none). A
        due row another claim holds is looked at again no sooner than `job_wake_s`, not in a
        tight loop. `heard`: the wake-ups heard when the claim began (None: all of them); one
        heard since is kept, as the claim's snapshot may have missed its row."""
        outbox, changes = self.heard if heard is None else heard
        self.claim_now = self.heard[0] != outbox
        self.job_changed = self.heard[1] != changes
        self.last_claim, self.holding = now, holding
        self.due_at = None if due_in_s is None else now + max(due_in_s, self.times.job_wake_s)
        self._poll_at = now + self.times.poll_interval_s
        if self.retry_at is not None and self.retry_at <= now:
            self.retry_at = None

    def retry_after(self, seconds: float) -> None:
        at = time.monotonic() + seconds
        self.retry_at = at if self.retry_at is None else min(self.retry_at, at)

    def publish_by(self, at: float) -> None:
        self.publish_due = at if self.publish_due is None else min(self.publish_due, at)
        self.kick.set()

    def _wants_claim(self, now: float) -> bool:
        if self.job_changed and not self.holding:
            self.job_changed = False
        return (
            self.claim_now
            or now >= self._poll_at
            or (self.retry_at is not None and now >= self.retry_at)
            or (self.due_at is not None and now >= self.due_at)
            or (self.job_changed and now >= self.last_claim + self.times.job_wake_s)
        )

    def due(self, now: float, blocked: bool) -> Action | None:
        """What to do now: a claim (wanted, the slots not full, Temporal not known to be away,
        `claim_every_s` since the last), else a publish whose time has come, else nothing."""
        may_claim = not blocked and now >= max(
            self.paused_until, self.last_claim + self.times.claim_every_s
        )
        if may_claim and self._wants_claim(now):
            return "claim"
        if self.publish_due is not None and now >= self.publish_due:
            return "publish"
        return None

    def _next_at(self, now: float, blocked: bool) -> float:
        """The earliest time something may become due without a kick."""
        at = [self._poll_at]
        if self.retry_at is not None:
            at.append(self.retry_at)
        if self.due_at is not None:
            at.append(max(self.due_at, self.paused_until))
        if self.publish_due is not None:
            at.append(self.publish_due)
        if not blocked and (self.claim_now or self.job_changed):
            soonest = self.last_claim + self.times.claim_every_s
            if self.job_changed and not self.claim_now:
                soonest = self.last_claim + max(self.times.job_wake_s, self.times.claim_every_s)
            at.append(max(soonest, self.paused_until))
        return min(at)

    async def wait(self, stop: asyncio.Event, blocked: Callable[[], bool]) -> None:
        """Until something is due (`due`), or the stop."""
        if self._poll_at == 0.0:
            self._poll_at = time.monotonic() + self.times.poll_interval_s
        while not stop.is_set():
            now = time.monotonic()
            if self.due(now, blocked()) is not None:
                return
            self.kick.clear()
            timeout = max(0.0, self._next_at(now, blocked()) - now)
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.kick.wait())]
            try:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
