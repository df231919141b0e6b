"""What a client sees of a long source while it runs and when it stops early, over real HTTP:
`item` events on the job's stream (and the all-jobs stream) as chunks succeed, before the
terminal event, each chunk once, resumable by Last-Event-ID; the artifacts API listing the
succeeded chunks' items (`final: false`) while the job runs; and a job cancelled or failed
after some chunks succeeded keeping their merged items (projected rows, `result.partial`).

The chunks are written here as the fan-out writes them (output, 'succeeded' and the job's
progress in one transaction with `pg_notify`), so these pin the read side on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from temporalio.client import Client

from activities.reconciler import Reconciler
from db import lifecycle as lifecycle_db
from db.chunks import PlannedChunk
from db.session import SessionMaker
from engine.hashing import output_hash
from engine.settings import Settings
from jobs import lifecycle
from jobs.chunked import chunk_model
from jobs.types import default_catalog
from jobs.types.quiz_generation import JOB as QUIZ
from runtime.wiring import reconciler_config
from tests.e2e.conftest import Api, start_api
from tests.support import eventually

PARAGRAPH = (
    "Photosynthesis turns light into chemical energy. It happens in the chloroplasts of plant "
    "cells, where chlorophyll absorbs red and blue light. The Calvin cycle then fixes carbon "
    "dioxide into sugars that the plant uses to grow.\n\n"
)
# Every sentence different, so the synthetic provider's questions are too (a repeated paragraph
# would make the merge drop most of them as repeats).
LONG = "".join(
    f"Observation {i} recorded that sample{i} absorbed {i % 17} units of light near "
    f"station{i % 29}. The measurement{i} was repeated by team{i % 11} on day {i % 31}.\n\n"
    for i in range(2000)
)[:200_000]
CATALOG = default_catalog()


@pytest.fixture
async def api(db: SessionMaker, settings: Settings) -> AsyncIterator[Api]:
    """The real app on a socket, no workers: a job stays where the test puts it."""
    async with start_api(settings) as a:
        yield a


async def long_quiz(api: Api, count: int = 12, source: str = LONG) -> str:
    r = await api.create(
        jobType="quiz_generation", input={"sourceText": source, "count": count}, expect=202
    )
    return str(r.json()["jobId"])


async def start_running(db: SessionMaker, job_id: str) -> None:
    async with db.begin() as s:
        wf = await s.scalar(text("SELECT workflow_id FROM ai_job WHERE id = :j"), {"j": job_id})
        await lifecycle_db.lock(s, uuid.UUID(job_id), owner=str(wf), identity="test", ttl_s=60)


async def chunks_of(db: SessionMaker, job_id: str) -> list[PlannedChunk]:
    async with db() as s:
        rows = await s.execute(
            text(
                "SELECT chunk_no, start_char, end_char, input_tokens, item_count "
                "FROM ai_job_chunk WHERE job_id = :j ORDER BY chunk_no"
            ),
            {"j": job_id},
        )
        return [PlannedChunk(*r) for r in rows]


async def succeed_chunk(db: SessionMaker, job_id: str, chunk: PlannedChunk, total: int) -> Any:
    """One chunk's success as the fan-out commits it; returns the chunk's output."""
    async with db.begin() as s:
        raw = await s.scalar(text("SELECT input FROM ai_job WHERE id = :j"), {"j": job_id})
        inp = QUIZ.input_model.model_validate(raw)
        part = QUIZ.input_model.model_validate(chunk_model(QUIZ, inp, chunk).model_dump())
        out = QUIZ.output_model.model_validate(QUIZ.synthetic_output(part)).model_dump(mode="json")
        await s.execute(
            text(
                "UPDATE ai_job_chunk SET status = 'succeeded', attempt_count = 1, output = :o, "
                "output_hash = :h, finished_at = now() WHERE job_id = :j AND chunk_no = :n"
            ).bindparams(bindparam("o", type_=JSONB)),
            {"j": job_id, "n": chunk.chunk_no, "o": out, "h": output_hash(out)},
        )
        done = await s.scalar(
            text("SELECT count(*) FROM ai_job_chunk WHERE job_id = :j AND status = 'succeeded'"),
            {"j": job_id},
        )
        await s.execute(
            text(
                "UPDATE ai_job SET progress = greatest(progress, :p), updated_at = now() "
                "WHERE id = :j RETURNING pg_notify('ai_job_changed', id::text)"
            ),
            {"j": job_id, "p": 10 + 80 * int(done) // total},
        )
    return out


def camel_questions(out: Any) -> list[dict[str, Any]]:
    return [
        {
            "question": q["question"],
            "choices": q["choices"],
            "answerIndex": q["answer_index"],
            "explanation": q["explanation"],
        }
        for q in out["questions"]
    ]


class Reader:
    """An SSE client running in the background: every event it has read so far."""

    def __init__(self, api: Api, path: str, headers: dict[str, str]) -> None:
        self.events: list[tuple[str | None, str | None, dict[str, Any]]] = []
        self.closed = False
        self._task = asyncio.create_task(self._read(api, path, headers))

    async def _read(self, api: Api, path: str, headers: dict[str, str]) -> None:
        fields: dict[str, str] = {}
        async with api.http.stream("GET", path, headers=headers) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line == "":
                    if "data" in fields:
                        data = json.loads(fields["data"])
                        self.events.append((fields.get("id"), fields.get("event"), data))
                    fields = {}
                elif not line.startswith(":"):
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")
        self.closed = True

    def items(self) -> list[dict[str, Any]]:
        return [d for _, e, d in self.events if e == "item"]

    async def wait(self, cond: Any, what: str, timeout: float = 15) -> None:
        async def holds() -> bool:
            if self._task.done():
                self._task.result()  # surface a failed read
            return bool(cond())

        await eventually(holds, timeout=timeout, what=what)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


async def artifacts(api: Api, job_id: str, **params: Any) -> Any:
    r = await api.http.get(f"/api/ai/jobs/{job_id}/artifacts", headers=api.as_user(), params=params)
    assert r.status_code == 200, r.text
    return r.json()


async def test_items_stream_as_chunks_land_and_a_cancel_keeps_them(
    api: Api, db: SessionMaker
) -> None:
    job_id = await long_quiz(api)
    chunks = await chunks_of(db, job_id)
    assert len(chunks) >= 3
    await start_running(db, job_id)
    job_stream = Reader(api, f"/api/ai/jobs/{job_id}/events", api.as_user())
    all_stream = Reader(api, "/api/ai/jobs/events", api.as_user())
    try:
        await job_stream.wait(lambda: job_stream.events, "the current state")
        assert job_stream.items() == []

        first = await succeed_chunk(db, job_id, chunks[0], len(chunks))
        n0 = len(first["questions"])
        await job_stream.wait(lambda: len(job_stream.items()) == n0, "chunk 0's items")
        await all_stream.wait(lambda: len(all_stream.items()) == n0, "chunk 0 on all jobs")
        items = job_stream.items()
        assert [(i["jobId"], i["chunk"], i["ordinal"]) for i in items] == [
            (job_id, 0, n) for n in range(n0)
        ]
        assert [i["content"] for i in items] == camel_questions(first)
        assert all_stream.items() == items
        resume_at = next(i for i, e, _ in job_stream.events if e == "item")

        # While it runs, the artifacts API lists the chunk's items, not final.
        page = await artifacts(api, job_id)
        assert [(a["chunk"], a["ordinal"], a["final"]) for a in page["items"]] == [
            (0, n, False) for n in range(n0)
        ]
        assert [a["content"] for a in page["items"]] == camel_questions(first)
        assert {a["artifactType"] for a in page["items"]} == {"chunk_item"}

        second = await succeed_chunk(db, job_id, chunks[1], len(chunks))
        n1 = len(second["questions"])
        await job_stream.wait(lambda: len(job_stream.items()) == n0 + n1, "chunk 1's items")
        assert [i["chunk"] for i in job_stream.items()] == [0] * n0 + [1] * n1

        # Paged in (chunk, ordinal) order across both chunks.
        seen: list[tuple[int, int]] = []
        cursor: str | None = None
        while True:
            page = await artifacts(api, job_id, limit=5, **({"cursor": cursor} if cursor else {}))
            seen += [(a["chunk"], a["ordinal"]) for a in page["items"]]
            cursor = page["nextCursor"]
            if cursor is None:
                break
        assert seen == [(0, n) for n in range(n0)] + [(1, n) for n in range(n1)]

        # Cancelled midway (as `finalize_cancelled` ends it): the two chunks' items are kept.
        async with db.begin() as s:
            came_from = await lifecycle.cancel(s, uuid.UUID(job_id), catalog=CATALOG)
        assert came_from == "running"
        await job_stream.wait(lambda: job_stream.closed, "the job stream to close")
        await all_stream.wait(
            lambda: any(d.get("lifecycleStatus") == "cancelled" for _, _, d in all_stream.events),
            "the cancel on all jobs",
        )
    finally:
        await job_stream.stop()
        await all_stream.stop()

    # Each chunk once per stream, and every item before the terminal event.
    assert len(job_stream.items()) == n0 + n1
    last = job_stream.events[-1]
    assert last[1] == "status" and last[2]["lifecycleStatus"] == "cancelled"
    ids = [int(i or 0) for i, _, _ in job_stream.events]
    assert ids == sorted(ids), ids
    assert len(all_stream.items()) == n0 + n1

    job = await api.get(job_id)
    assert job["lifecycleStatus"] == "cancelled" and job["errorCode"] == "CANCELLED"
    kept = {q["question"] for out in (first, second) for q in out["questions"]}
    assert job["result"]["partial"] is True
    assert job["result"]["artifactCount"] == min(12, len(kept))
    page = await artifacts(api, job_id)
    assert all(a["final"] and a["chunk"] is None for a in page["items"])
    assert [a["ordinal"] for a in page["items"]] == list(range(len(page["items"])))
    assert all(a["artifactType"] == "quiz_question" for a in page["items"])
    got = [a["content"]["question"] for a in page["items"]]
    assert len(set(got)) == len(got) and set(got) <= kept
    async with db() as s:
        stored = await s.scalar(text("SELECT output FROM ai_job WHERE id = :j"), {"j": job_id})
    assert [q["question"] for q in stored["questions"]] == got

    # A reconnect after chunk 0's items gets chunk 1's items and the end, nothing it had.
    again = Reader(
        api, f"/api/ai/jobs/{job_id}/events", {**api.as_user(), "Last-Event-ID": resume_at or ""}
    )
    try:
        await again.wait(lambda: again.closed, "the resumed stream to close")
    finally:
        await again.stop()
    assert [i["chunk"] for i in again.items()] == [1] * n1
    assert again.events[-1][2]["lifecycleStatus"] == "cancelled"


async def test_a_timed_out_job_keeps_its_chunks_and_says_why_it_stopped(
    api: Api, db: SessionMaker
) -> None:
    job_id = await long_quiz(api, count=20)
    chunks = await chunks_of(db, job_id)
    await start_running(db, job_id)
    out = await succeed_chunk(db, job_id, chunks[-1], len(chunks))
    async with db.begin() as s:
        wf = await s.scalar(text("SELECT workflow_id FROM ai_job WHERE id = :j"), {"j": job_id})
        ending = await lifecycle.finalize_failed(
            s, uuid.UUID(job_id), code="TIMEOUT", owner=str(wf), identity="t", catalog=CATALOG
        )
    assert ending is not None and ending.status == "failed"
    job = await api.get(job_id)
    assert job["lifecycleStatus"] == "failed" and job["errorCode"] == "TIMEOUT"
    assert job["result"]["partial"] is True
    assert job["result"]["artifactCount"] == len(out["questions"]) >= 2
    page = await artifacts(api, job_id)
    assert [a["content"]["answerIndex"] for a in page["items"]] == [
        q["answer_index"] for q in out["questions"]
    ]
    # The admin view and a list page say the same.
    listed = (await api.http.get("/api/ai/jobs", headers=api.as_user())).json()["items"]
    assert listed[0]["result"] == job["result"]


async def test_a_failure_before_any_chunk_keeps_nothing_and_the_shape_is_unchanged(
    api: Api, db: SessionMaker
) -> None:
    long_id = await long_quiz(api)
    short_id = await long_quiz(api, count=3, source=PARAGRAPH * 3)
    assert await chunks_of(db, short_id) == []
    for job_id in (long_id, short_id):
        await start_running(db, job_id)
        async with db.begin() as s:
            await lifecycle.fail(
                s, uuid.UUID(job_id), job_type="quiz_generation", code="TIMEOUT", catalog=CATALOG
            )
        job = await api.get(job_id)
        assert job["lifecycleStatus"] == "failed" and job["result"] is None
        assert (await artifacts(api, job_id))["items"] == []
    # A one-call job's stream has no item events.
    s1 = Reader(api, f"/api/ai/jobs/{short_id}/events", api.as_user())
    try:
        await s1.wait(lambda: s1.closed, "the stream to close")
    finally:
        await s1.stop()
    assert [e for _, e, _ in s1.events] == ["status"]


async def test_an_abandoned_long_job_failed_by_the_reconciler_keeps_its_chunks(
    api: Api, db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    """A worker vanished mid-job and its workflow is gone: the reconciler fails the job
    (INTERNAL_LOCK_EXPIRED) and, like every other ending, keeps what the chunks produced."""
    job_id = await long_quiz(api, count=20)
    chunks = await chunks_of(db, job_id)
    await start_running(db, job_id)
    out = await succeed_chunk(db, job_id, chunks[0], len(chunks))
    async with db.begin() as s:
        await s.execute(
            text("UPDATE ai_job SET lock_until = now() - interval '1 hour' WHERE id = :j"),
            {"j": job_id},
        )
    cfg = dataclasses.replace(
        reconciler_config(settings),
        missing_workflow_after_s=0,
        revive_base_s=0,
    )
    result = await Reconciler(db, temporal_client, cfg, catalog=CATALOG).run_once()
    assert result.expired_locks_failed == 1
    job = await api.get(job_id)
    assert job["lifecycleStatus"] == "failed" and job["errorCode"] == "INTERNAL_LOCK_EXPIRED"
    assert job["result"]["partial"] is True
    assert job["result"]["artifactCount"] == len(out["questions"]) >= 2
