"""The items of a long-source job's succeeded chunks, as clients see them before the job ends
(the artifact page, jobs/views.py, and the event stream, api/routes/events.py).

No business row exists for them yet: an item is named by its place (chunk, index within the
chunk) and its fields are shown in camelCase, the names the artifact views use for the same
fields. The final artifacts replace them once the job's merge has run.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic.alias_generators import to_camel
from sqlalchemy.ext.asyncio import AsyncSession

from db import stream_items as stream_items_db
from db.chunks import SucceededChunk, succeeded_chunks
from jobs.spec import Catalog

# An item of a long source's chunk before the job ends: no business row exists yet, so it is
# named by its place, (chunk, index within the chunk), and typed by this name.
CHUNK_ITEM_TYPE = "chunk_item"


@dataclass(frozen=True)
class ChunkItem:
    """One item of a succeeded chunk's output, as clients see it before the merge."""

    chunk: int
    ordinal: int
    content: dict[str, Any]


def item_content(item: Any) -> dict[str, Any]:
    """A chunk's output item as a client sees it: its fields in camelCase (the names the
    artifact views use for the same fields)."""
    if not isinstance(item, dict):
        return {"value": item}
    return {to_camel(str(k)): v for k, v in item.items()}


def chunk_items(catalog: Catalog, job_type: str, chunk: SucceededChunk) -> list[ChunkItem]:
    """The items of one succeeded chunk, in the chunk's order (empty for a type that does not
    chunk)."""
    spec = catalog.get(job_type).chunking if job_type in catalog else None
    if spec is None:
        return []
    items = chunk.output.get(spec.items_field) or []
    return [ChunkItem(chunk.chunk_no, n, item_content(it)) for n, it in enumerate(items)]


async def landed_chunks(
    session: AsyncSession, job_id: uuid.UUID, *, exclude: list[int] | None = None
) -> list[SucceededChunk]:
    """The job's succeeded chunks but those in `exclude` (a stream's already sent)."""
    return await succeeded_chunks(session, job_id, exclude=exclude or ())


# ---- one-call jobs: the items of an answer still being written (jobs/stream_items.py) -------

# The event that takes back an item already sent: its (chunk, ordinal) is no longer an item of
# the job (the final validation rejected it, or its attempt failed and a retry replaces it).
ITEM_RETRACTED = "item_retracted"


class SentItems(set[int]):
    """What one event stream sent of one job: the chunk numbers (the set itself) and, for a
    one-call job's streamed items, each (attempt, ordinal) sent and whether its retraction
    was sent too."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[tuple[int, int], bool] = {}


@dataclass(frozen=True)
class ItemEvent:
    """An `item` or `item_retracted` event of a one-call job: its name, data and version (the
    microseconds of its row's write or retraction)."""

    event: str
    data: dict[str, Any]
    version: int


def _micros(at: datetime) -> int:
    delta = at - datetime(1970, 1, 1, tzinfo=at.tzinfo)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def streams_items(catalog: Catalog, job_type: str) -> bool:
    """Whether a one-call job of this type may have streamed items (its output lists them)."""
    return job_type in catalog and catalog.get(job_type).chunking is not None


async def streamed_item_events(
    session: AsyncSession,
    job_id: uuid.UUID,
    sent: SentItems,
    since: int,
    ended_at: int | None = None,
) -> list[ItemEvent]:
    """The events a stream owes for a one-call job's streamed items: `item` for each live one
    not yet sent (and newer than `since`, the client's Last-Event-ID), `item_retracted` for
    each retracted one the stream sent (or the client had before its reconnect). The same
    data as a long source's item events, chunk 0: a one-call job is one chunk. `ended_at`: the
    job ended without an output (failed, cancelled) at that version: every item left is taken
    back then (an attempt cut before it could retract its own)."""
    out: list[ItemEvent] = []
    for r in await stream_items_db.rows(session, job_id):
        key = (r.attempt_no, r.ordinal)
        made = _micros(r.created_at)
        ref = {"jobId": str(job_id), "chunk": 0, "ordinal": r.ordinal}
        gone_at = _micros(r.retracted_at) if r.retracted_at is not None else ended_at
        if gone_at is None:
            if key not in sent.live and made > since:
                sent.live[key] = False
                out.append(ItemEvent("item", {**ref, "content": r.content}, made))
            continue
        gone = max(gone_at, made)
        had = key in sent.live or made <= since < gone
        if had and not sent.live.get(key, False):
            sent.live[key] = True
            out.append(ItemEvent(ITEM_RETRACTED, ref, gone))
    out.sort(key=lambda e: e.version)
    return out


async def running_items(
    session: AsyncSession, catalog: Catalog, job_type: str, job_id: uuid.UUID, *, chunked: bool
) -> list[ChunkItem]:
    """The items a running job shows before its artifacts exist: a long source's succeeded
    chunks' items, or a one-call job's streamed items of its live attempt (chunk 0)."""
    if chunked:
        landed = await landed_chunks(session, job_id)
        return [it for c in landed for it in chunk_items(catalog, job_type, c)]
    return [ChunkItem(0, r.ordinal, r.content) for r in await stream_items_db.live(session, job_id)]
