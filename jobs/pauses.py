"""Operator pauses (docs/admin.md "Operator pauses"): an admin stops the calls of the jobs a
pause matches (job type, provider, model, user: every member given must equal the job's; the
model is that of the call about to be sent) without losing the jobs, and resumes them.

- The admin's use cases (`Pauses`): create (201), list (the pauses in force), delete (resume:
  204, or 404 `PAUSE_NOT_FOUND`), each with its audit entry in its own transaction
  (`pause.create` outcome `paused`, `pause.delete` outcome `resumed`; `pause.expire`, actor
  `system`, for a pause lifted at its `expiresAt`).
- EXECUTE's side: `held` decides, in EXECUTE's first transaction (the pauses it read with its
  take, db/attempts.py), whether the call may go; a held call rolls that transaction back (the
  job stays as it was: `queued`, or `running` between two calls, no attempt spent) and `hold`
  records the job in `ai_pause_hold` in a short transaction of its own; its workflow waits on a
  durable timer (the pause's expiry, at most PAUSE_BACKSTOP_S) or its wake-up signal, holding no
  worker slot, and takes no room in its user's dispatch window meanwhile (db/relay.py).
- The pause waker's side (runtime/pause_waker.py): `lift_expired` and `release`: once a pause is
  lifted, the jobs it held go in fair order (each user's first, then each user's second...), at
  most AI_RESUME_RATE a second across the cluster, each woken by a signal.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from db import pauses as pauses_db
from db.pauses import InForce, PauseRow, Released
from db.session import SessionMaker
from engine.admin_errors import PauseNotFound
from engine.flow import OPERATOR_PAUSE, PAUSE_BACKSTOP_S, PauseMatch, held_by
from jobs.audit import AuditEntry, AuditLog
from jobs.waits import Wait

log = logging.getLogger(__name__)

PAUSE_CREATE = "pause.create"
PAUSE_DELETE = "pause.delete"
PAUSE_EXPIRE = "pause.expire"
TARGET = "pause"
SYSTEM_ACTOR = "system"
# A held job looks again a little after its pause's expiry (the waker lifts it then).
_AFTER_EXPIRY_S = 1.0


_CAMEL = {"job_type": "jobType", "provider": "provider", "model": "model", "user_id": "userId"}


def _detail(match: PauseMatch) -> dict[str, object]:
    """The audit entry's `detail`: the match as the API names it (names and ids from the
    admin, no job data)."""
    return {"match": {_CAMEL[k]: v for k, v in asdict(match).items() if v is not None}}


def match_of(row: PauseRow) -> PauseMatch:
    return PauseMatch(row.job_type, row.provider, row.model, row.user_id)


class Pauses:
    """The admin's use cases over one session factory."""

    def __init__(self, sessionmaker: SessionMaker) -> None:
        self._sm = sessionmaker
        self._audit = AuditLog(sessionmaker)

    async def create(
        self, match: PauseMatch, *, reason: str, expires_at: datetime | None, actor: str
    ) -> PauseRow:
        """The pause and its `pause.create` entry, in one transaction: from its commit on, no
        call of a matching job starts (db/pauses.py)."""
        async with self._sm.begin() as s:
            row = await pauses_db.create(
                s, uuid.uuid4(), match, reason=reason, expires_at=expires_at, created_by=actor
            )
            entry = AuditEntry(actor, PAUSE_CREATE, TARGET, str(row.id), _detail(match))
            await AuditLog.write(s, entry, "paused")
        log.info("operator pause created", extra={"pause_id": str(row.id)})
        return row

    async def listed(self) -> list[PauseRow]:
        async with self._sm() as s:
            return await pauses_db.listed(s)

    async def delete(self, pause_id: uuid.UUID, *, actor: str) -> PauseRow:
        """Resume: the pause is lifted with its `pause.delete` entry (the pause waker then
        releases the jobs it held); 404 `PAUSE_NOT_FOUND` when no such pause is in force."""
        entry = AuditEntry(actor, PAUSE_DELETE, TARGET, str(pause_id))
        async with self._audit.refusals(entry), self._sm.begin() as s:
            row = await pauses_db.delete(s, pause_id)
            if row is None:
                raise PauseNotFound("Pause not found.")
            await AuditLog.write(s, entry, "resumed", **_detail(match_of(row)))
        log.info("operator pause lifted", extra={"pause_id": str(pause_id)})
        return row


async def lift_expired(sm: SessionMaker) -> list[PauseRow]:
    """Lift the pauses past their `expiresAt`, as a DELETE does, each with its `pause.expire`
    entry (actor `system`), in one transaction."""
    async with sm.begin() as s:
        rows = await pauses_db.expire(s)
        for row in rows:
            entry = AuditEntry(SYSTEM_ACTOR, PAUSE_EXPIRE, TARGET, str(row.id))
            await AuditLog.write(s, entry, "resumed", **_detail(match_of(row)))
    return rows


async def next_expiry_s(sm: SessionMaker) -> float | None:
    async with sm() as s:
        return await pauses_db.next_expiry_s(s)


async def release(sm: SessionMaker, rate: float) -> Released:
    """One release pass (db/pauses.py `release`), in a transaction of its own."""
    async with sm.begin() as s:
        return await pauses_db.release(s, rate)


# ---- EXECUTE's side -------------------------------------------------------------------------


def held(
    pauses: tuple[InForce, ...],
    *,
    job_type: str,
    provider: str,
    model: str,
    user_id: str,
    now: datetime | None = None,
) -> Wait | None:
    """The wait of a call that a pause in force holds (reason `operator_pause`), None: it may
    go. It waits until the last matching pause's expiry (if all have one), at most the
    backstop; a wake-up signal ends it sooner."""
    matching = [p for p in pauses if p.match.matches(job_type, provider, model, user_id)]
    if not matching:
        return None
    wait_s = PAUSE_BACKSTOP_S
    ends = [p.expires_at for p in matching]
    if all(e is not None for e in ends):
        now = now or datetime.now(UTC)
        last = max(e for e in ends if e is not None)
        wait_s = min(wait_s, max((last - now).total_seconds(), 0.0) + _AFTER_EXPIRY_S)
    return Wait(wait_s, OPERATOR_PAUSE, provider, model, user_id=user_id, job_type=job_type)


@dataclass(frozen=True)
class Held:
    """`entered`: the job was not held before (counted once); `look_again`: no pause holds it
    any more (lifted between the look and the hold: the waker may have missed it)."""

    entered: bool
    look_again: bool = False


async def hold(
    sm: SessionMaker,
    wait: Wait,
    job_id: uuid.UUID,
    workflow_id: str,
    counted: Callable[[Wait], None],
) -> Held:
    """Record the held job, then read the pauses again (shared lock, after the insert): a pause
    lifted meanwhile means look again now. `counted(wait)` once when the job becomes held. A
    hold that cannot be written costs the job its wake-up only: it waits as told."""
    try:
        async with sm.begin() as s:
            entered = await pauses_db.hold(
                s,
                job_id,
                user_id=wait.user_id,
                workflow_id=workflow_id,
                job_type=wait.job_type,
                provider=wait.provider,
                model=wait.model,
            )
            still = held_by(
                tuple(p.match for p in await pauses_db.in_force(s)),
                wait.job_type,
                wait.provider,
                wait.model,
                wait.user_id,
            )
    except Exception as exc:
        log.warning("could not record a held job: %s", type(exc).__name__)
        return Held(entered=False)
    if entered:
        counted(wait)
    return Held(entered, look_again=not still)
