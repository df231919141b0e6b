"""Long sources over HTTP, as a client meets them, with an OpenAI-compatible mock as the
provider: a quiz over a source of many chunks streams its items as the chunks land (before the
terminal event) and ends with `count` distinct questions; Temporal's history shows the chunk
work and never the text; a second long job cancelled after its first item keeps the items its
succeeded chunks produced (artifacts API, `result.partial`, `artifactCount`)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from db.session import SessionMaker
from tests.e2e.conftest import Api, start_api
from tests.e2e.follow import Follow, all_artifacts
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.engine_helpers import history_blobs, local_stages, wait_workflow_closed
from tests.integration.provider_helpers import fake_env
from tests.stack import Stack, engine_stack

pytestmark = pytest.mark.slow

QUIZ = "quiz_generation"
MARKER = "The marker sentence kq5523 must never reach Temporal."
# A small per-call budget: a 12,000-character source makes several chunks.
SMALL_CALLS = {"AI_CHUNK_INPUT_TOKENS": 1000}


def long_source(paragraphs: int = 80) -> str:
    parts = [MARKER]
    for i in range(paragraphs):
        parts.append(
            f"Paragraph {i} explains that enzyme catalysts{i} accelerate reactions{i} inside "
            f"cells. Researchers measured temperature{i} effects on molecules{i} carefully. "
            f"Observation{i} shows membranes{i} transport nutrients efficiently."
        )
    return "\n\n".join(parts)


def answer(tag: str, count: int = 4) -> dict[str, Any]:
    """A valid quiz answer whose questions are this call's own (`tag`)."""
    return {
        "questions": [
            {
                "question": f"Question {tag}-{i}?",
                "choices": [f"a{i}", f"b{i}", f"c{i}", f"d{i}"],
                "answer_index": i % 4,
                "explanation": f"Because {tag} {i}.",
            }
            for i in range(count)
        ]
    }


async def script_distinct(fake: FakeOpenAIServer, delay_s: float, calls: int = 60) -> None:
    """Every call answers after `delay_s` with questions no other call has."""
    steps = [{"kind": "slow", "delay_s": delay_s, "content": answer(f"c{n}")} for n in range(calls)]
    await fake.ascript(steps, default={"kind": "slow", "delay_s": delay_s, "content": answer("d")})


@contextlib.asynccontextmanager
async def long_stack(
    env: Any, temporal_client: Client, fake: FakeOpenAIServer, **extra: Any
) -> AsyncIterator[tuple[Api, Stack]]:
    """The API and the workers on the same settings (the API plans the chunks at create)."""
    settings = env(**fake_env(fake, **SMALL_CALLS, **extra))
    async with (
        engine_stack(settings, temporal_client) as stack,
        start_api(settings) as api,
    ):
        yield api, stack


async def test_a_long_quiz_streams_its_items_and_ends_with_count_distinct_questions(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    await script_distinct(fake, delay_s=0.3)
    async with long_stack(env, temporal_client, fake) as (api, stack):
        job_id = await api.create_id(jobType=QUIZ, input={"sourceText": long_source(), "count": 12})
        follow = Follow(api, job_id)
        try:
            await follow.until(lambda: follow.closed, "the stream to end", timeout=120)
        finally:
            await follow.stop()
        row = await stack.job(uuid.UUID(job_id))
        job = await api.get(job_id)
        final = await all_artifacts(api, job_id)
    n = row.chunk_count
    assert n is not None and n >= 4, n

    # Items arrive before the terminal event, every chunk's, each once.
    kinds = [e.event for e in follow.events]
    assert kinds[-1] == "status" and follow.events[-1].data["lifecycleStatus"] == "succeeded"
    first_item = kinds.index("item")
    assert first_item < len(kinds) - 1
    # The first item came while the job was still running (not all at the end).
    assert any(
        e.event == "status" and e.data["lifecycleStatus"] == "running"
        for e in follow.events[first_item:]
    ), kinds
    items = follow.items()
    keys = [(i["chunk"], i["ordinal"]) for i in items]
    assert len(keys) == len(set(keys)) == 4 * n
    assert {i["chunk"] for i in items} == set(range(n))
    assert all(i["jobId"] == job_id for i in items)
    assert all(
        set(i["content"]) == {"question", "choices", "answerIndex", "explanation"} for i in items
    )

    # The final questions: exactly `count`, distinct, all from the streamed items.
    assert job["result"]["artifactCount"] == 12 and "partial" not in job["result"]
    questions = [a["content"]["question"] for a in final]
    assert len(questions) == len(set(questions)) == 12
    assert set(questions) <= {i["content"]["question"] for i in items}
    assert all(a["final"] and a["chunk"] is None for a in final)

    # Temporal: the chunk work is visible, the source text is not.
    wid = stack.workflow_id(uuid.UUID(job_id), QUIZ)
    await wait_workflow_closed(temporal_client, wid)
    raw, as_json = await history_blobs(temporal_client, wid)
    assert MARKER.encode() not in raw and MARKER not in as_json and b"kq5523" not in raw
    assert b"Question c" not in raw  # nor the answers
    history = await temporal_client.get_workflow_handle(wid).fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert sorted(scheduled) == sorted(f"execute-chunk-{c}" for c in range(n))
    assert "merge" in local_stages(history)


async def test_a_long_quiz_cancelled_after_its_first_item_keeps_what_it_had(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    await script_distinct(fake, delay_s=0.8)
    # One chunk at a time: the cancel lands while later chunks are still to come.
    async with long_stack(env, temporal_client, fake, AI_CHUNK_CONCURRENCY=1) as (api, stack):
        job_id = await api.create_id(jobType=QUIZ, input={"sourceText": long_source(), "count": 12})
        follow = Follow(api, job_id)
        try:
            await follow.until(lambda: follow.items(), "the first item", timeout=60)
            r = await api.cancel(job_id)
            assert r.status_code == 202, r.text
            await follow.until(lambda: follow.closed, "the stream to end", timeout=60)
        finally:
            await follow.stop()
        job = await api.wait_status(job_id, timeout=60)
        kept = await all_artifacts(api, job_id)
        row = await stack.job(uuid.UUID(job_id))

    assert job["lifecycleStatus"] == "cancelled" and job["errorCode"] == "CANCELLED"
    assert row.chunk_count is not None
    streamed = follow.items()
    chunks_done = {i["chunk"] for i in streamed}
    assert 1 <= len(chunks_done) < row.chunk_count
    assert follow.events[-1].data["lifecycleStatus"] == "cancelled"
    # The items it kept: its succeeded chunks' items, merged, projected, final.
    assert job["result"]["partial"] is True
    assert job["result"]["artifactCount"] == len(kept) == min(12, len(streamed))
    assert all(a["final"] and a["artifactType"] == "quiz_question" for a in kept)
    assert {a["content"]["question"] for a in kept} <= {i["content"]["question"] for i in streamed}
    assert row.output is not None and len(row.output["questions"]) == len(kept)
