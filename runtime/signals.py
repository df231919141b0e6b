"""Signals a waker sends to workflows: one signal name, no payload, to each of a list of
workflow ids, concurrently. A run that ended meanwhile (not found) needs no signal; any other
failure leaves the run to its own backstop timer (a waker only ever shortens a wait)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from temporalio.client import Client
from temporalio.service import RPCError


async def signal_all(client: Client, workflow_ids: Iterable[str], signal: str) -> int:
    """Send `signal` to each workflow of `workflow_ids`; returns how many were delivered."""

    async def one(workflow_id: str) -> bool:
        with contextlib.suppress(RPCError):
            await client.get_workflow_handle(workflow_id).signal(signal)
            return True
        return False

    ids = list(workflow_ids)
    if not ids:
        return 0
    return sum(await asyncio.gather(*(one(wf) for wf in ids)))
