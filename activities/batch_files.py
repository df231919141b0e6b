"""Batch files deleted at the provider: a batch's input, output and error files once its results
are stored, an upload no batch uses at once, and the files of batches whose jobs were purged
(db/batch_files.py says which are due).

The batch workflow deletes its own batch's files right after it stored and signalled the
results; whatever it could not delete (the provider away, a crash) is deleted by the
reconciler's retention phase, which also deletes the files a purge or the retention made due.
A failed delete never holds anything back: it is recorded and tried again, backing off, by a
later pass (no loop of its own). A 404 counts as done.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from db import batch_files as files_db
from db.provider_gate import PLATFORM_KEY_REF
from db.session import SessionMaker
from engine.errors import ExecutionFailure
from jobs.gateway import Gateway
from providers.batch import BatchClient, has_batch_api
from providers.openai_compat import OpenAICompatibleProvider

log = logging.getLogger("activities.batch")

# (provider name, key ref) of a batch -> the client of its endpoints, or None: not this
# process's to reach (its files wait for a process that can).
ClientFor = Callable[[str, str], BatchClient | None]
PASS_LIMIT = 100  # files a retention pass deletes at most
PASS_BUDGET_S = 8.0  # and the wall time it spends on them (the phase's budget is 15 s)


def gateway_clients(gateway: Gateway) -> ClientFor:
    """The batch endpoints a worker reaches: its gateway's platform provider, when it has a
    Batch API (a batch is only ever sent there, with the platform key)."""

    def client_for(provider_name: str, key_ref: str) -> BatchClient | None:
        provider = gateway.provider
        if (
            not isinstance(provider, OpenAICompatibleProvider)
            or provider.name != provider_name
            or not has_batch_api(provider)
            or key_ref != PLATFORM_KEY_REF
        ):
            return None
        return BatchClient(provider.base_url, provider.http_client, gateway.platform_api_key)

    return client_for


async def delete_due(
    sm: SessionMaker,
    client_for: ClientFor,
    *,
    batch_id: uuid.UUID | None = None,
    limit: int = PASS_LIMIT,
    budget_s: float | None = None,
) -> int:
    """Delete the files due (of `batch_id` only, when given); returns how many are gone. Each
    delete is recorded on its own; one that fails waits for a later pass, and so do the files
    left when `budget_s` (wall time) has run out."""
    async with sm() as s:
        files = await files_db.due(s, batch_id=batch_id, limit=limit)
    gone = 0
    deadline = None if budget_s is None else time.monotonic() + budget_s
    for f in files:
        if deadline is not None and time.monotonic() > deadline:
            break
        client = client_for(f.provider, f.key_ref)
        if client is None:
            continue
        try:
            await client.delete_file(f.file_id)
        except ExecutionFailure as exc:
            async with sm.begin() as s:
                await files_db.delete_failed(s, f.batch_id, f.file_id)
            log.info(
                "batch.file_delete_failed", extra={"batch_id": str(f.batch_id), "code": exc.code}
            )
            continue
        async with sm.begin() as s:
            await files_db.deleted(s, f.batch_id, f.file_id)
        gone += 1
    return gone


class BatchFiles:
    """The retention phase's part: the files due, deleted through the process's clients."""

    def __init__(self, sm: SessionMaker, client_for: ClientFor) -> None:
        self._sm = sm
        self._client_for = client_for

    async def delete_due(self) -> int:
        return await delete_due(self._sm, self._client_for, budget_s=PASS_BUDGET_S)
