"""Server-sent event streams of job status (`text/event-stream`).

Each event is `id: <version>`, `event: status`, `data: <JobStatusResponse JSON>`. A job's version
is its `updated_at` in microseconds since the epoch: it only grows, so a client that reconnects
with `Last-Event-ID` gets the current state only if it is newer than what it has seen.

A long-source job's items are streamed as its chunks succeed, before its terminal event: one
`event: item` per item of each succeeded chunk, `data: {jobId, chunk, ordinal, content}`
(`content`: the chunk's output item with its fields in camelCase, as the artifacts API shows it
while the job runs). Each chunk is sent once per stream. A chunk's version is its `finished_at`
(written with its 'succeeded', in the transaction that raises the job's progress), and its item
events carry that version as their id (never less than an id already sent); a reconnect with
`Last-Event-ID` gets only the chunks newer than that id. One-call jobs send no item events.

Keep-alive comments go out every `SSE_PING_S` seconds. Wake-ups come from the process's one LISTEN
connection (`api/events.py`); a stream re-reads its job when woken, never on a timer.

Each stream holds one of its user's stream slots (`api/events.py` `StreamSlots`: a lease in
PostgreSQL for the per-user cap across processes, and the process's own count), taken
after the request is authorised and released when the response ends, however it ends; a
response that is never served releases it when it is garbage-collected. Past the caps the
route answers 429 `TOO_MANY_STREAMS` with Retry-After.
"""

from __future__ import annotations

import json
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.types import Receive, Scope, Send

from api.browser import StreamPrincipal, misused
from api.deps import JobId, State, StreamUser
from api.errors import PROBLEM
from api.events import STREAM_RETRY_AFTER_S, StreamSlot
from api.stream_schema import event_schema
from db import jobs as jobs_db
from db.jobs import JobRow
from engine.errors import JobNotFound
from engine.lifecycle import TERMINAL
from jobs import views
from jobs.chunk_items import (
    SentItems,
    chunk_items,
    landed_chunks,
    streamed_item_events,
    streams_items,
)
from jobs.views import JobRead, Viewer

router = APIRouter(prefix="/api/ai/jobs", tags=["jobs"])
RESYNC_LIMIT = 100  # jobs re-read at most after a reconnect of the all-jobs stream
# Concurrent event streams: per user across all API processes (leases in PostgreSQL,
# db/caps.py), and in all on one API process; past either, 429 TOO_MANY_STREAMS. Ten covers a
# user's tabs and devices; a thousand idle streams are a few MB and file descriptors a process
# keeps well within its limits.
MAX_STREAMS_PER_USER = 10
MAX_STREAMS = 1000
_SEEN = 1000  # jobs whose last sent state the all-jobs stream remembers
_MAX_VERSION = 2**63 - 1

_STREAM = {
    "description": "An event stream: `id` (the job's version), `event: status`, `data` (a "
    "JobStatusResponse as JSON); for a long-source job also `event: item`, `data` "
    "`{jobId, chunk, ordinal, content}`, one per item of each chunk as it succeeds; keep-alive "
    "comments in between.",
    "content": {"text/event-stream": {"schema": event_schema()}},
}
_TOO_MANY = {
    "description": "Too many event streams open (`TOO_MANY_STREAMS`): the user's "
    f"({MAX_STREAMS_PER_USER}) or this server's ({MAX_STREAMS}); see Retry-After",
    "headers": {
        "Retry-After": {
            "description": f"Seconds to wait before reconnecting ({STREAM_RETRY_AFTER_S})",
            "schema": {"type": "integer"},
        }
    },
    "content": {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}},
}
_RESPONSES: dict[int | str, dict[str, Any]] = {200: _STREAM, 429: _TOO_MANY}
_LAST_EVENT_ID = Header(
    alias="Last-Event-ID",
    pattern=r"^[0-9]{1,19}$",
    description="Resume: the `id` of the last event received.",
)


def _micros(at: datetime) -> int:
    delta = at - datetime(1970, 1, 1, tzinfo=at.tzinfo)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def version(row: JobRow) -> int:
    return _micros(row.updated_at)


def _last_id(value: str | None) -> int:
    if value is None:
        return -1
    # Any id the header's pattern allows: one past every version (more than 63 bits) is read
    # as the highest, "seen everything", rather than refused.
    return min(int(value), _MAX_VERSION)


async def _read(state: State, job_id: uuid.UUID, viewer: Viewer) -> JobRead | None:
    """The job as `viewer` may see it (the same view as `GET /api/ai/jobs/{jobId}`)."""
    async with state.sessionmaker() as s:
        return await views.find_job(s, job_id, viewer)


def _event(job: JobRead, event_id: int | None = None) -> ServerSentEvent:
    data = job.view().model_dump_json(by_alias=True)
    return ServerSentEvent(data=data, id=str(event_id or version(job.row)), event="status")


async def _item_events(
    state: State, row: JobRow, sent: set[int], since: int, high: int
) -> tuple[list[ServerSentEvent], int]:
    """The `item` events of the job's chunks that succeeded since this stream last looked
    (`sent`: the chunk numbers already handled, updated here), and the stream's new high id.
    A chunk no newer than `since` (the client's Last-Event-ID) was delivered before the
    reconnect and is skipped. One-call jobs cost no query."""
    if row.chunk_count is None:
        return await _streamed_item_events(state, row, sent, since, high)
    async with state.sessionmaker() as s:
        chunks = await landed_chunks(s, row.id, exclude=sorted(sent))
    events: list[ServerSentEvent] = []
    for chunk in chunks:
        sent.add(chunk.chunk_no)
        at = _micros(chunk.finished_at) if chunk.finished_at is not None else version(row)
        if at <= since:
            continue
        high = max(high, at)
        for item in chunk_items(state.catalog, row.job_type, chunk):
            data = {
                "jobId": str(row.id),
                "chunk": item.chunk,
                "ordinal": item.ordinal,
                "content": item.content,
            }
            events.append(ServerSentEvent(data=json.dumps(data), id=str(high), event="item"))
    return events, high


async def _streamed_item_events(
    state: State, row: JobRow, sent: set[int], since: int, high: int
) -> tuple[list[ServerSentEvent], int]:
    """A one-call job's items streamed while its answer is written (and their retractions);
    a job of a type without items, or not running, costs no query (once a stream sent items,
    it looks once more after the job ended, for their retractions)."""
    live = sent if isinstance(sent, SentItems) else None
    if live is None or not streams_items(state.catalog, row.job_type):
        return [], high
    if row.lifecycle_status != "running" and not live.live:
        return [], high
    status = row.lifecycle_status
    ended = version(row) if status in TERMINAL and status != "succeeded" else None
    async with state.sessionmaker() as s:
        found = await streamed_item_events(s, row.id, live, since, ended)
    events = []
    for ev in found:
        high = max(high, ev.version)
        events.append(ServerSentEvent(data=json.dumps(ev.data), id=str(high), event=ev.event))
    return events, high


class _SlottedStream(EventSourceResponse):
    """An event stream that gives its slot back when it ends: normally (a terminal state),
    on a client disconnect, on server shutdown or on an error, since all of them leave
    `__call__`. A response that is never called releases the slot when it is collected."""

    def __init__(self, slot: StreamSlot, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slot = slot
        weakref.finalize(self, slot.release)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._slot.aclose()


async def _slot(state: State, user_id: str) -> StreamSlot:
    """A stream slot for `user_id`, or 429 TOO_MANY_STREAMS (the per-user cap across every API
    process). Take it last in the route: an error raised after it would leave it to the
    garbage collector."""
    slots = state.events.stream_slots(per_user=MAX_STREAMS_PER_USER, total=MAX_STREAMS)
    return await slots.acquire(user_id)


def _stream(
    state: State, slot: StreamSlot, gen: AsyncIterator[ServerSentEvent]
) -> EventSourceResponse:
    return _SlottedStream(
        slot,
        gen,
        ping=state.settings.sse_ping_s,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@router.get(
    "/events",
    summary="Follow all of your jobs (server-sent events)",
    description=(
        "One `status` event each time one of your jobs is created or changes state or progress, "
        "and a long-source job's `item` events as its chunks succeed. Never closed by a job's "
        "end. With `Last-Event-ID`, first the jobs changed since then "
        "(at most 100)."
    ),
    response_class=EventSourceResponse,
    responses=_RESPONSES,
)
async def user_events(
    state: State,
    principal: StreamUser,
    last_event_id: Annotated[str | None, _LAST_EVENT_ID] = None,
) -> EventSourceResponse:
    since = _last_id(last_event_id)
    hub = state.events
    user_id = principal.user_id

    async def changed_since(cutoff: int) -> list[uuid.UUID]:
        async with state.sessionmaker() as s:
            return await jobs_db.changed_since(s, user_id, cutoff, limit=RESYNC_LIMIT)

    async def gen() -> AsyncIterator[ServerSentEvent]:
        sent: OrderedDict[uuid.UUID, tuple[str, int]] = OrderedDict()
        # The chunks whose items were sent, per long-source job (forgotten with `sent`).
        chunks_sent: dict[uuid.UUID, set[int]] = {}
        # The newest version seen (or the stream's start): after a reconnect of the listener,
        # the jobs changed since shortly before it are re-read.
        high = since if since >= 0 else int(time.time() * 1_000_000)

        async def emit(job_ids: list[uuid.UUID]) -> AsyncIterator[ServerSentEvent]:
            nonlocal high
            for job_id in job_ids:
                got = await _read(state, job_id, principal)
                if got is None:
                    continue
                row = got.row
                # Items before the status event that reports their chunk's progress.
                items, _ = await _item_events(
                    state, row, chunks_sent.setdefault(job_id, SentItems()), since, -1
                )
                for ev in items:
                    yield ev
                key = (row.lifecycle_status, row.progress)
                if sent.get(job_id) == key:
                    continue
                sent[job_id] = key
                sent.move_to_end(job_id)
                if len(sent) > _SEEN:
                    forgotten, _ = sent.popitem(last=False)
                    chunks_sent.pop(forgotten, None)
                high = max(high, version(row))
                yield _event(got)

        async with hub.subscribe_user(user_id) as sub:
            if since >= 0:
                async for ev in emit(await changed_since(since)):
                    yield ev
            while True:
                ids, resync = await sub.next_batch()
                if resync:
                    ids |= set(await changed_since(high - 1_000_000))
                async for ev in emit(sorted(ids)):
                    yield ev

    return _stream(state, await _slot(state, user_id), gen())


@router.get(
    "/{jobId}/events",
    summary="Follow one of your jobs (server-sent events)",
    description=(
        "First the job's current state, then one `status` event per change of state or "
        "progress; the stream ends after a terminal state. A long-source job's items come as "
        "`item` events as its chunks succeed, each chunk once, before the terminal event. With "
        "`Last-Event-ID`, the current state and the chunks' items are sent only if newer than "
        "that event."
    ),
    response_class=EventSourceResponse,
    responses=_RESPONSES,
)
async def job_events(
    job_id: JobId,
    state: State,
    principal: StreamUser,
    last_event_id: Annotated[str | None, _LAST_EVENT_ID] = None,
) -> EventSourceResponse:
    since = _last_id(last_event_id)
    async with state.sessionmaker() as s:
        try:
            await views.check_visible(s, job_id, principal)
        except JobNotFound:
            # A stream token opens its own user's jobs only: any other is a misuse of it.
            if isinstance(principal, StreamPrincipal):
                raise misused() from None
            raise
    hub = state.events

    async def gen() -> AsyncIterator[ServerSentEvent]:
        async with hub.subscribe_job(job_id) as sub:
            last_key: tuple[str, int] | None = None
            high = since
            chunks_sent: set[int] = SentItems()
            while True:
                got = await _read(state, job_id, principal)
                if got is None:
                    return
                row = got.row
                key = (row.lifecycle_status, row.progress)
                # The version decides only the first event (resume). After that a change of
                # state or progress is always sent: `updated_at` is a transaction's start time,
                # so a later change can carry an older one. Ids never go down.
                fresh = version(row) > high if last_key is None else key != last_key
                # A long source's new items go first: before the status event of their
                # chunk's progress, and always before the terminal one.
                items, high = await _item_events(state, row, chunks_sent, since, high)
                for ev in items:
                    yield ev
                if fresh:
                    high, last_key = max(high, version(row)), key
                    yield _event(got, high)
                if row.lifecycle_status in TERMINAL:
                    return
                await sub.next_batch()

    return _stream(state, await _slot(state, principal.user_id), gen())
