"""Job change streams: one LISTEN connection per API process, fanned out in memory.

Every lifecycle transition and progress change runs `pg_notify('ai_job_changed', <job id>)` in
its own transaction (`db/lifecycle.py`, `db/jobs.py`), so a notification arrives only after the
change is committed and readable. The hub holds ONE autocommit psycopg connection that LISTENs
on that channel, started lazily on the first subscription, and hands each notification to:

- the subscribers of that job (a bounded asyncio queue each, keyed by job id);
- the subscribers of the job's owner (keyed by user id), when there are any: the owner is read
  once per notification (and remembered: a job never changes owner).

A queue receives job ids; a subscriber re-reads the job and sends what changed. Nothing polls.
When the connection drops, the hub reconnects with a backoff and then wakes every subscriber
with `RESYNC`, one re-read that covers notifications lost while it was away. A queue that
overflows (a reader stalled) is cleared and gets `RESYNC` instead. A subscription ends with its
`async with` block (the client disconnected, or the stream ended) and its queue is dropped.

Streams are bounded (`StreamSlots`): a stream holds a slot from before its response starts until
it ends, whatever ends it (the client leaves, the job ends, the server shuts down, an error).
Past MAX_STREAMS_PER_USER streams of one user, or MAX_STREAMS in the process, a new
stream is refused with 429 `TOO_MANY_STREAMS` and Retry-After. The per-user cap is the
cluster's: each stream of a user also holds a lease row in PostgreSQL (db/caps.py), taken under
the user's advisory lock, renewed every `STREAM_LEASE_TTL_S / 3` while the stream lasts and
deleted when it ends, so with N API processes a user still holds at most the cap, and a killed
process's streams stop counting after `STREAM_LEASE_TTL_S`. The total cap is per process by
nature: it protects this process's memory and connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import psycopg

from db import caps as caps_db
from db import jobs as jobs_db
from db.lifecycle import JOB_CHANGED_CHANNEL
from db.session import SessionMaker, listen_connection, ping_connection
from engine.errors import EngineError

log = logging.getLogger(__name__)

RESYNC = "resync"  # a queue item: re-read everything this subscriber follows
QUEUE_SIZE = 256
_OWNER_CACHE = 10_000


# Seconds a refused client waits before it tries again (streams last minutes: a few seconds
# of delay costs nothing and keeps a reconnect loop from hammering the process).
STREAM_RETRY_AFTER_S = 5
# A stream's lease in PostgreSQL lives this long unless renewed (every third of it): how long a
# killed process's streams keep counting against their users.
STREAM_LEASE_TTL_S = 30.0
STREAM_CAP = "stream"  # `cap_lease.kind` of an event stream


class TooManyStreams(EngineError):
    code = "TOO_MANY_STREAMS"
    http_status = 429
    title = "Too many event streams"


class StreamSlot:
    """One open stream's hold on its user's and the process's counts, and on its lease in
    PostgreSQL. `release` (sync, idempotent) frees the counts at once and the lease soon after;
    `aclose` frees the lease first, so that a stream that has ended no longer counts anywhere
    when it returns. Every exit path may call either."""

    def __init__(self, slots: StreamSlots, user_id: str) -> None:
        self._slots = slots
        self.user_id = user_id
        self.lease_id: uuid.UUID | None = None
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._slots._release(self)

    async def aclose(self) -> None:
        lease, self.lease_id = self.lease_id, None
        try:
            if lease is not None and not self.released:
                await self._slots.drop_lease(lease)
        finally:
            self.release()


def too_many(message: str) -> TooManyStreams:
    return TooManyStreams(message, retry_after_s=STREAM_RETRY_AFTER_S)


class StreamSlots:
    """Caps on event streams: `per_user` at once for one user across every API process (leases
    through `sessionmaker`; without one, this process's count only) and `total` at once in this
    process. The process's counts are reserved before the lease is asked for (no await between
    check and increment), so two requests racing for the last slot cannot both get it."""

    def __init__(
        self,
        *,
        per_user: int,
        total: int,
        sessionmaker: SessionMaker | None = None,
        lease_ttl_s: float = STREAM_LEASE_TTL_S,
    ) -> None:
        if per_user < 1 or total < 1:
            raise ValueError("stream caps must be at least 1")
        self.per_user = per_user
        self.total = total
        self._sm = sessionmaker
        self._ttl_s = lease_ttl_s
        self._holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._by_user: dict[str, int] = {}
        self._open = 0
        self._leases: set[uuid.UUID] = set()
        self._renewer: asyncio.Task[None] | None = None

    @property
    def open(self) -> int:
        return self._open

    def held_by(self, user_id: str) -> int:
        return self._by_user.get(user_id, 0)

    async def acquire(self, user_id: str) -> StreamSlot:
        """A slot for a new stream of `user_id`, or TooManyStreams (429, Retry-After)."""
        if self._by_user.get(user_id, 0) >= self.per_user:
            raise too_many(self._per_user_message())
        if self._open >= self.total:
            raise too_many("This server has no room for another event stream; try again later.")
        self._by_user[user_id] = self._by_user.get(user_id, 0) + 1
        self._open += 1
        slot = StreamSlot(self, user_id)
        if self._sm is None:
            return slot
        try:
            slot.lease_id = await caps_db.take(
                self._sm,
                STREAM_CAP,
                user_id,
                cap=self.per_user,
                holder=self._holder,
                ttl_s=self._ttl_s,
            )
        except BaseException:
            slot.release()
            raise
        if slot.lease_id is None:
            slot.release()
            raise too_many(self._per_user_message())
        self._leases.add(slot.lease_id)
        self._ensure_renewer()
        return slot

    def _per_user_message(self) -> str:
        return (
            f"At most {self.per_user} event streams per user may be open at once; close one "
            "or try again later."
        )

    def _release(self, slot: StreamSlot) -> None:
        self._open -= 1
        left = self._by_user.get(slot.user_id, 0) - 1
        if left > 0:
            self._by_user[slot.user_id] = left
        else:
            self._by_user.pop(slot.user_id, None)
        lease, slot.lease_id = slot.lease_id, None
        if lease is None:
            return
        self._leases.discard(lease)
        with contextlib.suppress(RuntimeError):  # no loop (a collected response): it lapses
            asyncio.get_running_loop().create_task(self.drop_lease(lease))

    async def drop_lease(self, lease_id: uuid.UUID) -> None:
        """Deletes a lease now; if the database is away, it lapses after its TTL instead."""
        self._leases.discard(lease_id)
        if self._sm is None:
            return
        try:
            await caps_db.release(self._sm, lease_id)
        except Exception:
            log.warning("stream lease not released; it lapses after its TTL")

    def _ensure_renewer(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew(), name="stream-leases")

    async def _renew(self) -> None:
        """Every third of the TTL, this process's leases are extended in one statement; the
        task ends when no stream is left (the next stream starts it again)."""
        assert self._sm is not None
        while self._leases:
            await asyncio.sleep(self._ttl_s / 3)
            try:
                await caps_db.renew(self._sm, list(self._leases), ttl_s=self._ttl_s)
            except Exception:
                log.warning("stream leases not renewed; trying again")

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(BaseException):
                await self._renewer


@dataclass(eq=False)
class Subscription:
    """What one stream waits on: job ids (`uuid.UUID`) or `RESYNC`."""

    key: uuid.UUID | str
    queue: asyncio.Queue[uuid.UUID | str] = field(default_factory=lambda: asyncio.Queue(QUEUE_SIZE))

    def push(self, item: uuid.UUID | str) -> None:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(RESYNC)

    async def next_batch(self) -> tuple[set[uuid.UUID], bool]:
        """Waits for at least one item, then takes all that are queued: (job ids, resync)."""
        items = [await self.queue.get()]
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        ids = {i for i in items if isinstance(i, uuid.UUID)}
        return ids, RESYNC in items


class JobEventHub:
    def __init__(
        self,
        database_url: str,
        sessionmaker: SessionMaker,
        *,
        idle_check_s: float = 15.0,
        max_backoff_s: float = 5.0,
    ) -> None:
        self._database_url = database_url
        self._sm = sessionmaker
        self._idle_check_s = idle_check_s
        self._max_backoff_s = max_backoff_s
        self._by_job: dict[uuid.UUID, set[Subscription]] = {}
        self._by_user: dict[str, set[Subscription]] = {}
        self._owners: OrderedDict[uuid.UUID, str] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self._conn: psycopg.AsyncConnection[object] | None = None
        self.connects = 0  # how many times the LISTEN connection was (re)established
        self._slots: StreamSlots | None = None

    @property
    def slots(self) -> StreamSlots | None:
        """The stream caps, once a stream has asked for them."""
        return self._slots

    def stream_slots(self, *, per_user: int, total: int) -> StreamSlots:
        """The stream caps: one `StreamSlots` per hub (one hub per API process), built by the
        first stream with the app's settings (the same on every call), its per-user cap held
        in PostgreSQL through the hub's sessionmaker."""
        if self._slots is None:
            self._slots = StreamSlots(per_user=per_user, total=total, sessionmaker=self._sm)
        return self._slots

    # ---- subscriptions ----------------------------------------------------------------

    @property
    def subscriber_count(self) -> int:
        return sum(len(s) for s in self._by_job.values()) + sum(
            len(s) for s in self._by_user.values()
        )

    @contextlib.asynccontextmanager
    async def subscribe_job(self, job_id: uuid.UUID) -> AsyncIterator[Subscription]:
        async with self._subscribe(self._by_job, job_id) as sub:
            yield sub

    @contextlib.asynccontextmanager
    async def subscribe_user(self, user_id: str) -> AsyncIterator[Subscription]:
        async with self._subscribe(self._by_user, user_id) as sub:
            yield sub

    @contextlib.asynccontextmanager
    async def _subscribe(
        self, table: dict[Any, set[Subscription]], key: uuid.UUID | str
    ) -> AsyncIterator[Subscription]:
        sub = Subscription(key)
        table.setdefault(key, set()).add(sub)
        try:
            self._ensure_started()
            # Registered before the caller reads the current state, and listening before it
            # reads: a change committed after that read always wakes the queue.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._listening.wait(), 5.0)
            yield sub
        finally:
            subs = table.get(key)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del table[key]

    # ---- the listener -----------------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="job-event-hub")

    async def close(self) -> None:
        if self._slots is not None:
            await self._slots.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None
        self._listening.clear()

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            try:
                async with await listen_connection(self._database_url, JOB_CHANGED_CHANNEL) as conn:
                    self._conn = conn
                    self.connects += 1
                    self._listening.set()
                    backoff = 0.2
                    if self.connects > 1:
                        self._wake_all()  # notifications may have been lost while away
                    await self._listen(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("job event listener lost its connection: %s", type(exc).__name__)
            finally:
                self._conn = None
                self._listening.clear()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._max_backoff_s)

    async def _listen(self, conn: psycopg.AsyncConnection[object]) -> None:
        while True:
            got = False
            async for note in conn.notifies(timeout=self._idle_check_s):
                got = True
                await self._dispatch(note.payload)
            if not got:
                await ping_connection(conn)

    def _wake_all(self) -> None:
        for subs in (*self._by_job.values(), *self._by_user.values()):
            for sub in subs:
                sub.push(RESYNC)

    async def _dispatch(self, payload: str) -> None:
        try:
            job_id = uuid.UUID(payload)
        except ValueError:
            return
        for sub in self._by_job.get(job_id, ()):
            sub.push(job_id)
        if not self._by_user:
            return
        owner = self._owners.get(job_id)
        if owner is None:
            try:
                async with self._sm() as s:
                    found = await jobs_db.get_owner(s, job_id)
            except Exception:
                log.warning("job event listener could not read a job's owner")
                return
            if found is None:
                return
            owner = found[1]
            self._owners[job_id] = owner
            if len(self._owners) > _OWNER_CACHE:
                self._owners.popitem(last=False)
        for sub in self._by_user.get(owner, ()):
            sub.push(job_id)

    async def drop_connection_for_tests(self) -> None:
        """Closes the LISTEN connection as a network failure would (the hub reconnects)."""
        if self._conn is not None:
            await self._conn.close()
