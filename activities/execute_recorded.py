"""EXECUTE for runs recorded before the five stages: the only home of their branches, to be
deleted with their histories once no such run can still be replayed or resumed.

Two shapes of the workflow predate the current one (engine/contracts.py `ExecuteInput`):
- `yield_on_gate=False`: the activity itself waited for its provider gate, heartbeating, instead
  of returning the wait for the workflow's timer (`begin_when_admitted`);
- `project_in_slot=True`: the output was projected inside EXECUTE's last transaction, before the
  slot was let go, instead of by the PROJECT stage (`settle_and_project`).
Everything else an attempt does is the current EXECUTE's (activities/execute.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel
from temporalio import activity

from activities.deps import StageDeps, log
from activities.failures import internal_message, loggable, private_strings
from activities.project import project_output
from db import attempts as attempts_db
from db import lifecycle as lifecycle_db
from db.attempts import Settlement
from db.errors import is_unavailable
from db.jobs import JobRow
from engine.contracts import ProjectResult

if TYPE_CHECKING:
    from activities.execute import Begun

Outcome = Literal["projected", "stored", "cancelled", "not_owner"]


async def begin_when_admitted(begin: Callable[[], Awaitable[Begun]], job_id: str) -> Begun:
    """The first transaction, once the job's provider admits a call. While it is paused
    (a 429's Retry-After) or its breaker is open, the transaction is rolled back (the job
    stays `queued`), the attempt is not spent, and this slot waits, heartbeating."""
    announced = False
    while True:
        begun = await begin()
        if begun.gate_wait_s <= 0:
            return begun
        if not announced:
            log.info(
                "provider paused; the job waits without spending an attempt",
                extra={"job_id": job_id},
            )
            announced = True
        deadline = time.monotonic() + min(max(begun.gate_wait_s, 0.2), 5.0)
        while time.monotonic() < deadline:
            activity.heartbeat()
            await asyncio.sleep(min(0.5, max(deadline - time.monotonic(), 0.01)))


async def settle_and_project(
    d: StageDeps, st: Settlement, row: JobRow, validated: BaseModel
) -> tuple[Outcome, ProjectResult | None]:
    """The last transaction of a one-call job: `db/attempts.py` `settle`'s statements, then,
    while the job is still ours and nobody asked to cancel it, its projection in a savepoint
    (a projector that fails leaves the stored output for PROJECT). A cancel seen here is
    honoured."""
    async with d.sessionmaker.begin() as s:
        settled = await attempts_db.settle_in_session(s, st)
        if not settled.owned:
            return "not_owner", None
        if settled.cancel_requested:
            return "cancelled", None  # the commit still settles the probe
        try:
            async with s.begin_nested():
                projected = await project_output(d, s, row, validated, st.output_hash, st.owner)
                return "projected", projected
        except Exception as exc:
            if is_unavailable(exc):
                raise
            log.warning(
                "projection inside EXECUTE failed; PROJECT will retry it",
                extra={"job_id": str(row.id), "error_type": type(exc).__name__},
                exc_info=loggable(exc),
            )
            await lifecycle_db.record_attempt(
                s,
                row.id,
                attempt=st.attempt,
                internal_error=internal_message(
                    exc,
                    private=private_strings(row.input, st.output),
                    context="projection failed",
                ),
            )
            return "stored", None
