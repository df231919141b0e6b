"""The events a stream owes for a one-call job's streamed items (jobs/chunk_items.py
`streamed_item_events`): each live item once, a retraction only for an item the client has
(sent on this stream, or before its reconnect), in the order they were written."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from db import stream_items as stream_items_db
from db.stream_items import StreamItemRow
from jobs import chunk_items
from jobs.chunk_items import ITEM_RETRACTED, SentItems, streamed_item_events

T0 = datetime(2026, 12, 5, tzinfo=UTC)
JOB = uuid.uuid4()


def at(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def micros(ms: int) -> int:
    return chunk_items._micros(at(ms))


def row(attempt: int, ordinal: int, made: int, gone: int | None = None) -> StreamItemRow:
    retracted = at(gone) if gone is not None else None
    return StreamItemRow(attempt, ordinal, {"q": f"{attempt}-{ordinal}"}, at(made), retracted)


@pytest.fixture
def rows(monkeypatch: pytest.MonkeyPatch) -> list[StreamItemRow]:
    table: list[StreamItemRow] = []

    async def read(_s: Any, job_id: uuid.UUID) -> list[StreamItemRow]:
        assert job_id == JOB
        return list(table)

    monkeypatch.setattr(stream_items_db, "rows", read)
    return table


async def test_each_item_once_then_its_retraction_then_the_retrys(
    rows: list[StreamItemRow],
) -> None:
    sent = SentItems()
    rows += [row(1, 0, 10), row(1, 1, 20)]
    got = await streamed_item_events(None, JOB, sent, -1)  # type: ignore[arg-type]
    assert [(e.event, e.data["ordinal"]) for e in got] == [("item", 0), ("item", 1)]
    assert got[0].data == {"jobId": str(JOB), "chunk": 0, "ordinal": 0, "content": {"q": "1-0"}}
    assert await streamed_item_events(None, JOB, sent, -1) == []  # type: ignore[arg-type]
    rows[:] = [row(1, 0, 10, 30), row(1, 1, 20, 30), row(2, 0, 40)]
    got = await streamed_item_events(None, JOB, sent, -1)  # type: ignore[arg-type]
    assert [(e.event, e.data["ordinal"]) for e in got] == [
        (ITEM_RETRACTED, 0),
        (ITEM_RETRACTED, 1),
        ("item", 0),
    ]
    assert got[0].data == {"jobId": str(JOB), "chunk": 0, "ordinal": 0}
    assert [e.version for e in got] == [micros(30), micros(30), micros(40)]
    assert await streamed_item_events(None, JOB, sent, -1) == []  # type: ignore[arg-type]


async def test_a_reconnect_gets_what_it_missed_and_no_retraction_of_what_it_never_had(
    rows: list[StreamItemRow],
) -> None:
    rows += [row(1, 0, 10, 50), row(1, 1, 20, 50), row(1, 2, 60, 70), row(2, 0, 80)]
    # The client had item 0 (id at 15 ms): its retraction is owed, item 1's is not, nor item 2's
    # (written and retracted while it was away).
    got = await streamed_item_events(None, JOB, SentItems(), micros(15))  # type: ignore[arg-type]
    assert [(e.event, e.data["ordinal"], e.version) for e in got] == [
        (ITEM_RETRACTED, 0, micros(50)),
        ("item", 0, micros(80)),
    ]


async def test_a_job_that_ended_without_output_takes_back_what_is_left(
    rows: list[StreamItemRow],
) -> None:
    sent = SentItems()
    rows += [row(1, 0, 10), row(1, 1, 20)]
    await streamed_item_events(None, JOB, sent, -1)  # type: ignore[arg-type]
    got = await streamed_item_events(None, JOB, sent, -1, micros(90))  # type: ignore[arg-type]
    assert [(e.event, e.data["ordinal"], e.version) for e in got] == [
        (ITEM_RETRACTED, 0, micros(90)),
        (ITEM_RETRACTED, 1, micros(90)),
    ]
