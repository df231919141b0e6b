"""The one sender of signals to the engine's workflows: one signal name, no payload, to each of a
list of workflow ids, concurrently. Every signal the engine sends goes through `signal_all`:
the limit and reuse wakers' wake-ups, a batch's results to its jobs and a cancelled batch job's
poke of its batch (the batch activities get it from the worker, runtime/worker.py).

A run that ended meanwhile (not found) needs no signal. Any other failure is, by default, left
to the run's own backstop timer (a waker only ever shortens a wait); `strict` raises it instead,
for a sender whose activity must retry until its signals are delivered."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode


async def signal_all(
    client: Client, workflow_ids: Iterable[str], signal: str, *, strict: bool = False
) -> int:
    """Send `signal` to each workflow of `workflow_ids`; returns how many were delivered."""

    async def one(workflow_id: str) -> bool:
        try:
            await client.get_workflow_handle(workflow_id).signal(signal)
        except RPCError as exc:
            if strict and exc.status != RPCStatusCode.NOT_FOUND:
                raise
            return False
        return True

    ids = list(workflow_ids)
    if not ids:
        return 0
    return sum(await asyncio.gather(*(one(wf) for wf in ids)))
