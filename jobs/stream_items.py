"""Items while the model is still writing: one call's streamed answer, item by item.

A job type whose output lists items (its `ChunkSpec.items_field`: a quiz's `questions`, a
deck's `cards`) gets an `ItemPublisher` for each one-call attempt. The provider hands it each
piece of the answer as it arrives (`on_delta`, a cheap synchronous callback); `engine/items.py`
`ItemStream` says which items became complete; each has its PII placeholders restored
(jobs/guardrails.py), is validated on its own by the list's item model (redacted when the type
redacts its output) and queued; with moderation, the writer publishes only the items the
moderation endpoint passed (a flagged item is never shown). A writer task (`run`) writes
what is queued in one transaction per batch (`db/stream_items.py` `publish`, which notifies
`ai_job_changed`): while one batch is being written the next accumulates, so a burst of items
is a few transactions, not one each, and an idle stream costs none. Readers (the event streams,
the artifacts page) read the rows back; nothing of an item goes to Temporal (the heartbeat
carries counts, `progress`).

Invariants:
- an item is published only if it validated on its own and can be stored (no NUL, no unpaired
  surrogate: jobs/output.py `unstorable`); its ordinal is its place in the
  answer's list, so the final output's item at that ordinal is the same item;
- the final answer is still validated whole (jobs/output.py); `settle` then retracts every
  published item the final output does not hold unchanged at its ordinal, and every item of an
  attempt that failed (`settle(None)`): a retry's items replace them, never mix with them;
- a database that fails while items are written costs the preview, never the call: the writer
  logs the error's type, keeps the batch and tries again with the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, TypeAdapter, ValidationError

from db import stream_items as stream_items_db
from db.session import SessionMaker
from engine.items import ItemStream
from engine.pii import NO_MASKING
from engine.redaction import redact
from jobs.chunk_items import item_content
from jobs.guardrails import Guard, item_text
from jobs.output import unstorable
from jobs.spec import AnyJobType

log = logging.getLogger("jobs.stream_items")
T = TypeVar("T")
Progress = Callable[[], dict[str, int]]  # the heartbeat's details: counts only

# A failed write is tried again after this long (with the next batch), so a database outage
# costs one attempt per interval, not one per item.
_RETRY_WRITE_S = 0.5
_SETTLE_TRIES = 3


@functools.cache
def _item_adapter(output_model: type[BaseModel], list_field: str) -> TypeAdapter[Any] | None:
    f = output_model.model_fields.get(list_field)
    if f is None:
        return None
    args = get_args(f.annotation)
    return TypeAdapter(args[0]) if args else None


@dataclass
class StreamStats:
    """What a publisher did, in counts and times (the heartbeat's and the bench's)."""

    items: int = 0  # complete and valid, queued
    rejected: int = 0  # complete but invalid on their own: never shown
    written: int = 0  # rows committed
    batches: int = 0  # transactions that wrote them
    retracted: int = 0
    write_errors: int = 0
    flagged: int = 0  # moderation flagged: never shown
    # (monotonic time the item was found complete, monotonic time its batch committed)
    timings: list[tuple[float, float]] = field(default_factory=list)


class ItemPublisher:
    """Publishes one attempt's items as its answer streams (module docstring). One per call;
    `on_delta` runs on the event loop's thread (the provider's reader), `run` beside it."""

    def __init__(
        self,
        sessionmaker: SessionMaker,
        jt: AnyJobType,
        job_id: uuid.UUID,
        attempt: int,
        list_field: str,
        adapter: TypeAdapter[Any],
        guard: Guard | None = None,
    ) -> None:
        self._sm = sessionmaker
        self._redact = jt.definition.security.output_redaction
        # The call's guardrails: placeholders restored in each item before it is validated;
        # with moderation, an item is published only once moderation passed it.
        self._masking = guard.masking if guard is not None else NO_MASKING
        self._guard = guard if guard is not None and guard.moderates else None
        self.job_id = job_id
        self.attempt = attempt
        self.list_field = list_field
        self._adapter = adapter
        self._stream = ItemStream(list_field)
        # (ordinal, content, found at, the item's text as the provider wrote it)
        self._pending: list[tuple[int, dict[str, Any], float, str]] = []
        self._wake = asyncio.Event()
        self._published: dict[int, dict[str, Any]] = {}  # ordinal -> content, committed
        self._closing = False  # the call returned: write what is queued, then stop
        self._moderation_down = False
        self.stats = StreamStats()

    # ---- while the provider writes ----------------------------------------------------

    def on_delta(self, piece: str) -> None:
        """A piece of the answer: the items it completed, validated and queued. Never raises
        (the provider's reader must not fail for the preview)."""
        try:
            found = self._stream.feed(piece)
        except Exception:
            return
        if not found:
            return
        first = self._stream.emitted - len(found)
        now = time.monotonic()
        for n, raw in enumerate(found, start=first):
            content = self._validated(raw)
            if content is None:
                self.stats.rejected += 1
                continue
            self.stats.items += 1
            self._pending.append((n, content, now, item_text(raw)))
        self._wake.set()

    def _validated(self, raw: Any) -> dict[str, Any] | None:
        try:
            value = self._adapter.validate_python(self._masking.restore(raw))
        except (ValidationError, ValueError, TypeError):
            return None
        dumped = self._adapter.dump_python(value, mode="json")
        if self._redact:
            dumped = redact(dumped)
        if unstorable(dumped):
            # Never published (its write would fail, and with it the batch of items beside
            # it); the stream goes on, and the final answer's validation decides the attempt.
            return None
        return item_content(dumped)

    def progress(self) -> dict[str, int]:
        """The heartbeat's details: counts only, never content."""
        return {"items": self.stats.items, "written": self.stats.written}

    async def run(self) -> None:
        """Write queued items, a batch per wake-up, until cancelled or, once the call has
        returned (`_closing`), until the queue is written (or a last write failed)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not await self._write():
                if self._closing:
                    return
                await asyncio.sleep(_RETRY_WRITE_S)
                if self._pending:
                    self._wake.set()
            if self._closing and not self._pending:
                return

    async def _write(self) -> bool:
        """One transaction for everything queued; False when it failed (kept for later)."""
        # Taken off the queue only once committed: a batch whose transaction failed is tried
        # again (ON CONFLICT makes a batch that did commit one anyway).
        batch = list(self._pending)
        if not batch:
            return True
        passed = await self._moderated(batch)
        try:
            written = await stream_items_db.publish(
                self._sm, self.job_id, self.attempt, [(n, c) for n, c, _, _ in passed]
            )
        except Exception as exc:
            self.stats.write_errors += 1
            log.warning("stream items not written: %s", type(exc).__name__)
            return False
        del self._pending[: len(batch)]
        done = time.monotonic()
        self.stats.batches += 1
        self.stats.written += written
        for n, c, found_at, _ in passed:
            self._published[n] = c
            self.stats.timings.append((found_at, done))
        return True

    async def _moderated(
        self, batch: list[tuple[int, dict[str, Any], float, str]]
    ) -> list[tuple[int, dict[str, Any], float, str]]:
        """The items of `batch` moderation passed (all, without moderation). A moderation
        endpoint that fails publishes nothing more of this call: the final answer's
        moderation decides."""
        if self._guard is None:
            return batch
        if self._moderation_down:
            return []
        try:
            verdicts = await self._guard.verdicts([text for _, _, _, text in batch])
        except Exception as exc:
            self._moderation_down = True
            log.warning("stream items not moderated: %s", type(exc).__name__)
            return []
        self.stats.flagged += sum(verdicts)
        return [item for item, flagged in zip(batch, verdicts, strict=True) if not flagged]

    async def during(self, call: Awaitable[T]) -> T:
        """Await `call` (the provider call) with the writer running beside it; after a call
        that returned, the items still queued are written before this returns (a call that
        raised leaves them to `settle`)."""
        writer = asyncio.ensure_future(self.run())
        try:
            result = await call
        except BaseException:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            raise
        # The writer ends its batch in hand (never cut mid-transaction), then the last one.
        self._closing = True
        self._wake.set()
        await writer
        return result

    # ---- after the call ---------------------------------------------------------------

    async def settle(self, output: dict[str, Any] | None, kept: list[int] | None = None) -> None:
        """The attempt's items against its final output (as stored): each published item the
        output does not hold unchanged at its place is retracted; `None` (the attempt failed,
        or was cut) retracts them all. `kept`: the answer's places the output's items came
        from, in order, when moderation dropped some (None: the output's item n is the
        answer's item n). Tried a few times: a kept item must be true."""
        self._pending = []
        if output is not None:
            final = output.get(self.list_field)
            items = final if isinstance(final, list) else []
            at = {place: i for i, place in enumerate(kept)} if kept is not None else None
            wrong = [
                n
                for n, c in self._published.items()
                if not _holds(items, n if at is None else at.get(n, len(items)), c)
            ]
            if not wrong:
                return
        else:
            wrong = list(self._published)
        for attempt in range(_SETTLE_TRIES):
            try:
                async with self._sm.begin() as s:
                    self.stats.retracted += await stream_items_db.retract(
                        s, self.job_id, self.attempt, wrong, all_of_it=output is None
                    )
                return
            except Exception as exc:
                log.warning("stream items not retracted: %s", type(exc).__name__)
                await asyncio.sleep(_RETRY_WRITE_S * (attempt + 1))


def _holds(items: list[Any], i: int, content: dict[str, Any]) -> bool:
    return i < len(items) and item_content(items[i]) == content


class NoItems:
    """The publisher of a call whose items are not streamed (a type without an item list, a
    long source's chunk, whose items are shown when the chunk succeeds): does nothing."""

    on_delta = None
    progress = None

    async def during(self, call: Awaitable[T]) -> T:
        return await call

    async def settle(self, output: dict[str, Any] | None, kept: list[int] | None = None) -> None:
        return None


def publisher(
    sessionmaker: SessionMaker,
    jt: AnyJobType,
    job_id: uuid.UUID,
    attempt: int,
    chunk: object | None = None,
    guard: Guard | None = None,
) -> ItemPublisher | NoItems:
    """The attempt's publisher: a one-call job whose type lists items gets one (`chunk`: the
    long source's chunk of the call, whose items are shown when it succeeds, gets none), under
    the call's guardrails (`guard`: placeholders restored, items moderated before they show)."""
    spec = jt.chunking
    if spec is None or chunk is not None:
        return NoItems()
    output_model: type[BaseModel] = jt.output_model
    adapter = _item_adapter(output_model, spec.items_field)
    if adapter is None:
        return NoItems()
    return ItemPublisher(sessionmaker, jt, job_id, attempt, spec.items_field, adapter, guard)
