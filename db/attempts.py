"""EXECUTE's two hot transactions, each a named function with a typed result: `take` (the CAS
queued → running and the read of the job and its snapshot, in one round trip) and `settle` (a
valid answer's usage row, what it tells the key's gate and limits, the attempt's bookkeeping and
the output, in one round trip for a one-call job).

The statements are the repositories' own (`db/lifecycle.py` LOCK and SETTLE_ATTEMPT,
`db/jobs.py` GET_WITH_SNAPSHOT, `db/usage.py` INSERT, `db/provider_gate.py` REACHABLE,
`db/provider_limits.py` `settle_statements`), sent through `db/pipeline.py`, which stays
private to `db/`: the stage and its use cases see only these functions and their results.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from db import chunks as chunks_db
from db import jobs as jobs_db
from db import lifecycle as lifecycle_db
from db import pipeline
from db import provider_gate as provider_gate_db
from db import provider_limits as provider_limits_db
from db import usage as usage_db
from db.jobs import JobRow
from db.provider_gate import GateKey
from db.provider_limits import LimitSettle
from db.session import SessionMaker
from db.usage import UsageRow


@dataclass(frozen=True)
class TakenJob:
    """What `take` read once the job was this owner's: the row and its unexpired snapshot
    (None once expired or never stored)."""

    row: JobRow
    snapshot: dict[str, Any] | None


async def take(
    s: AsyncSession,
    job_id: uuid.UUID,
    *,
    owner: str,
    identity: str,
    ttl_s: int,
    run_id: str | None,
) -> TakenJob | None:
    """CAS queued → running (or this owner's own lock, on a retry) and the read of the job and
    its snapshot, pipelined in the caller's transaction: one round trip; the read sees the CAS's
    update and is not used when the CAS matched no row. A missed CAS raises what
    `lifecycle.locked_of` raises (`IllegalTransition`, `LockConflict`, `JobNotFound`); None:
    the job row was not read."""
    params = lifecycle_db.lock_params(
        job_id, owner=owner, identity=identity, ttl_s=ttl_s, run_id=run_id
    )
    locked, read = await pipeline.in_session(
        s, [(lifecycle_db.LOCK, params), (jobs_db.GET_WITH_SNAPSHOT, {"id": job_id})]
    )
    await lifecycle_db.locked_of(s, job_id, locked[0] if locked else None)
    found = jobs_db.with_snapshot_of(read[0] if read else None)
    return None if found is None else TakenJob(*found)


@dataclass(frozen=True)
class Settlement:
    """A valid answer to store: the call's usage row, the gate it went through (the key
    answered: `reachable`), the limits to settle (None: nothing taken, nothing announced) and
    the attempt's output, for the job or for one of its chunks (`chunk_no`)."""

    usage: UsageRow
    gate: GateKey | None
    limits: LimitSettle | None
    job_id: uuid.UUID
    owner: str
    attempt: int
    ttl_s: int
    output: dict[str, Any]
    output_hash: str
    chunk_no: int | None = None


@dataclass(frozen=True)
class Settled:
    """`owned`: the job was still the owner's, running; `cancel_requested`: a cancel was asked
    for. The output was stored when owned and no cancel was requested."""

    owned: bool
    cancel_requested: bool


def _statements(st: Settlement) -> tuple[list[pipeline.Statement], int]:
    """A one-call job's settlement in order (the usage row, the gate's `reachable`, the
    attempt's one UPDATE, the limits' end), and the index of the UPDATE."""
    statements: list[pipeline.Statement] = [(usage_db.INSERT, st.usage.__dict__)]
    if st.gate is not None:
        statements.append((provider_gate_db.REACHABLE, st.gate.params()))
    settle_at = len(statements)
    statements.append(
        (
            lifecycle_db.SETTLE_ATTEMPT,
            lifecycle_db.settle_attempt_params(
                st.job_id,
                owner=st.owner,
                attempt=st.attempt,
                ttl_s=st.ttl_s,
                output=st.output,
                output_hash=st.output_hash,
                progress=60,
            ),
        )
    )
    if st.limits is not None:
        statements.extend(provider_limits_db.settle_statements(st.limits))
    return statements, settle_at


async def settle(sm: SessionMaker, st: Settlement) -> Settled:
    """The last transaction of a paid call, committed in every outcome. A one-call job's goes
    as BEGIN, its statements and COMMIT in one round trip; a chunk's stores the chunk's output
    (`chunks.settle`, whose second statement depends on its first) in the same order."""
    if st.chunk_no is not None:
        async with sm.begin() as s:
            return await _settle_chunk(s, st, st.chunk_no)
    statements, at = _statements(st)
    rows = (await pipeline.run(sm, statements, commit=True))[at]
    return Settled(*lifecycle_db.settled(rows[0] if rows else None))


async def settle_in_session(s: AsyncSession, st: Settlement) -> Settled:
    """`settle`'s statements pipelined in the caller's open transaction (which then goes on:
    runs recorded before the five stages project the output in it)."""
    statements, at = _statements(st)
    rows = (await pipeline.in_session(s, statements))[at]
    return Settled(*lifecycle_db.settled(rows[0] if rows else None))


async def _settle_chunk(s: AsyncSession, st: Settlement, chunk_no: int) -> Settled:
    await usage_db.insert(s, st.usage)
    if st.gate is not None:
        await provider_gate_db.reachable(s, st.gate)
    owned, cancel_requested = await chunks_db.settle(
        s,
        st.job_id,
        chunk_no,
        owner=st.owner,
        attempt=st.attempt,
        ttl_s=st.ttl_s,
        output=st.output,
        output_hash=st.output_hash,
    )
    if st.limits is not None:
        for stmt, params in provider_limits_db.settle_statements(st.limits):
            await s.execute(stmt, params)
    return Settled(owned, cancel_requested)
