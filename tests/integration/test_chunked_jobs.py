"""A long source runs as its chunks, on the real stack: one EXECUTE per chunk (a window of them
in flight, each with its own retries), MERGE into one output of `count` distinct items, one
PROJECT; Temporal sees chunk numbers, never the text; an admin retry calls only for the chunks
the original did not pay for; a short source still makes one call."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from db.session import SessionMaker
from jobs.types import quiz_generation
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.engine_helpers import (
    history_blobs,
    local_stages,
    wait_workflow_closed,
)
from tests.integration.provider_helpers import fake_env
from tests.stack import Stack, engine_stack, make_settings

pytestmark = pytest.mark.slow

QUIZ = "quiz_generation"
MARKER = "The marker sentence zq7781 must never reach Temporal."
# Per-call prompt budget of these tests: a 12,000-character source makes several chunks.
SMALL_CALLS = {"AI_CHUNK_INPUT_TOKENS": 1000}


def long_source(paragraphs: int = 80, marker: str = MARKER) -> str:
    """Distinct sentences (each names its own number), so every chunk's questions differ."""
    parts = [marker]
    for i in range(paragraphs):
        parts.append(
            f"Paragraph {i} explains that enzyme catalysts{i} accelerate reactions{i} inside "
            f"cells. Researchers measured temperature{i} effects on molecules{i} carefully. "
            f"Observation{i} shows membranes{i} transport nutrients efficiently."
        )
    return "\n\n".join(parts)


def quiz_answer(count: int, tag: str = "q") -> dict[str, Any]:
    """A valid quiz answer of `count` distinct questions (what the fake provider says)."""
    return {
        "questions": [
            {
                "question": f"Question {tag}{i}?",
                "choices": [f"a{i}", f"b{i}", f"c{i}", f"d{i}"],
                "answer_index": i % 4,
                "explanation": f"Because {i}.",
            }
            for i in range(count)
        ]
    }


async def rows(st: Stack, sql: str, job_id: uuid.UUID) -> list[Any]:
    async with st.parts.sessionmaker() as s:
        return list(await s.execute(text(sql), {"j": job_id}))


async def usage(st: Stack, job_id: uuid.UUID) -> dict[int | None, list[int]]:
    """Each chunk's attempt numbers, from the usage rows (one per provider call)."""
    out: dict[int | None, list[int]] = {}
    for r in await rows(
        st,
        "SELECT chunk_no, attempt_no FROM ai_usage_log WHERE job_id = :j ORDER BY chunk_no, id",
        job_id,
    ):
        out.setdefault(r.chunk_no, []).append(r.attempt_no)
    return out


async def chunk_table(st: Stack, job_id: uuid.UUID) -> list[Any]:
    return await rows(
        st,
        "SELECT chunk_no, start_char, end_char, status, attempt_count, output_hash, error_code "
        "FROM ai_job_chunk WHERE job_id = :j ORDER BY chunk_no",
        job_id,
    )


def word_only_in_the_last_of_three_chunks(st: Stack, source: str) -> str:
    """A word of `source` that only its third (last) planned chunk holds: past the second
    chunk's end, so not in their overlap. The plan must have three chunks."""
    inp = quiz_generation.QuizGenerationInput.model_validate({"sourceText": source})
    plan = st.service.plan_chunks(st.parts.catalog.get(QUIZ), inp)
    assert plan is not None and len(plan) == 3, plan
    only_last = source[plan[1].end_char : plan[2].end_char]
    return next(w for w in only_last.split() if w.startswith("reactions"))


def chunk_activity_ids(history: Any) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def test_a_long_source_runs_as_its_chunks_and_merges_into_count_questions(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    settings = make_settings(database_url, temporal_address, **SMALL_CALLS)
    async with engine_stack(settings, temporal_client) as st:
        job = await st.create(job_type=QUIZ, input={"sourceText": long_source(), "count": 12})
        row = await st.wait_status(job, timeout=60)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        n = row.chunk_count
        assert n is not None and n >= 4
        # N calls, one per chunk, each its first attempt.
        assert await usage(st, job) == {c: [1] for c in range(n)}
        chunks = await chunk_table(st, job)
        assert [(c.status, c.attempt_count) for c in chunks] == [("succeeded", 1)] * n
        # One output of exactly `count` distinct questions, projected once.
        questions = row.output["questions"]
        assert len(questions) == 12
        assert len({q["question"].casefold() for q in questions}) == 12
        assert row.progress == 100
        artifacts = await rows(st, "SELECT ordinal FROM ai_job_artifact WHERE job_id = :j", job)
        assert sorted(a.ordinal for a in artifacts) == list(range(12))

        wid = st.workflow_id(job, QUIZ)
        await wait_workflow_closed(temporal_client, wid)
        raw, as_json = await history_blobs(temporal_client, wid)
        # Temporal holds no source text, in its JSON or inside a payload.
        assert MARKER.encode() not in raw and MARKER not in as_json
        assert b"zq7781" not in raw
        history = await temporal_client.get_workflow_handle(wid).fetch_history()
        ids = chunk_activity_ids(history)
        assert sorted(ids) == sorted(f"execute-chunk-{c}" for c in range(n))
        assert local_stages(history) == ["prepare", "resolve", "merge", "project", "complete"]
        # The history stays small per chunk (docs/architecture.md: about 6 events a chunk).
        assert len(history.events) <= 25 + 6 * n, len(history.events)


async def test_a_short_source_still_makes_one_call(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    settings = make_settings(database_url, temporal_address, **SMALL_CALLS)
    async with engine_stack(settings, temporal_client) as st:
        short = "Mitochondria produce energy for the cell. Ribosomes build proteins."
        job = await st.create(job_type=QUIZ, input={"sourceText": short, "count": 2})
        row = await st.wait_status(job, timeout=30)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert row.chunk_count is None
        assert await usage(st, job) == {None: [1]}
        wid = st.workflow_id(job, QUIZ)
        await wait_workflow_closed(temporal_client, wid)
        history = await temporal_client.get_workflow_handle(wid).fetch_history()
        assert all(not i.startswith("execute-chunk") for i in chunk_activity_ids(history))
        assert "merge" not in local_stages(history)


async def test_a_chunk_that_fails_once_is_retried_alone(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    # The first call the provider sees fails (a 500); every other call answers.
    await fake.ascript(
        [{"kind": "status", "status": 500}],
        default={"kind": "valid", "content": quiz_answer(10)},
    )
    settings = make_settings(database_url, temporal_address, **fake_env(fake, **SMALL_CALLS))
    async with engine_stack(settings, temporal_client) as st:
        job = await st.create(job_type=QUIZ, input={"sourceText": long_source(), "count": 10})
        row = await st.wait_status(job, timeout=60)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        n = row.chunk_count
        assert n is not None and n >= 4
        calls = await usage(st, job)
        assert set(calls) == set(range(n))
        retried = [c for c, attempts in calls.items() if attempts != [1]]
        assert len(retried) == 1 and calls[retried[0]] == [1, 2], calls
        chunks = await chunk_table(st, job)
        assert [c.attempt_count for c in chunks] == [
            2 if c.chunk_no == retried[0] else 1 for c in chunks
        ]
        assert (await fake.acalls())["count"] == n + 1
        # Every chunk answered the same ten questions: the merge keeps them once.
        assert len(row.output["questions"]) == 10


async def test_no_more_chunks_than_the_window_are_in_flight(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    await fake.ascript([], default={"kind": "slow", "delay_s": 0.4, "content": quiz_answer(5)})
    settings = make_settings(
        database_url,
        temporal_address,
        # Worker slots to spare: the window is the only bound on one job's calls.
        **fake_env(fake, AI_CHUNK_CONCURRENCY=2, AI_INTERACTIVE_CONCURRENCY=8, **SMALL_CALLS),
    )
    async with engine_stack(settings, temporal_client) as st:
        job = await st.create(job_type=QUIZ, input={"sourceText": long_source(), "count": 5})
        row = await st.wait_status(job, timeout=60)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert row.chunk_count is not None and row.chunk_count >= 4
    timings = await fake.atimings()
    assert len(timings["started_at"]) == row.chunk_count
    assert timings["max_in_flight"] == 2


async def test_an_admin_retry_calls_only_for_the_chunk_that_failed(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    source = long_source(paragraphs=40)
    settings = make_settings(
        database_url,
        temporal_address,
        # One chunk at a time: chunks 0 and 1 succeed before chunk 2 fails for good.
        **fake_env(fake, AI_CHUNK_CONCURRENCY=1, **SMALL_CALLS),
    )
    async with engine_stack(settings, temporal_client) as st:
        needle = word_only_in_the_last_of_three_chunks(st, source)
        await fake.ascript(
            [],
            default={"kind": "valid", "content": quiz_answer(5)},
            rules=[(needle, {"kind": "status", "status": 500})],
        )
        job = await st.create(job_type=QUIZ, input={"sourceText": source})
        row = await st.wait_status(job, timeout=60)
        assert (row.lifecycle_status, row.error_code) == ("failed", "PROVIDER_UNAVAILABLE")
        chunks = await chunk_table(st, job)
        assert [c.status for c in chunks] == ["succeeded", "succeeded", "failed"]
        assert chunks[2].error_code == "PROVIDER_UNAVAILABLE"
        before = (await fake.acalls())["count"]
        assert before == 2 + 2  # chunks 0 and 1, then chunk 2's two attempts

        await fake.ascript([], default={"kind": "valid", "content": quiz_answer(5)})
        retry = (await st.service.retry(job)).job
        row2 = await st.wait_status(retry.id, timeout=60)
        assert row2.lifecycle_status == "succeeded", (row2.error_code, row2.internal_error_message)
        assert (await fake.acalls())["count"] == before + 1
        assert await usage(st, retry.id) == {2: [1]}
        copied = await chunk_table(st, retry.id)
        assert [c.output_hash for c in copied[:2]] == [c.output_hash for c in chunks[:2]]
        assert [c.attempt_count for c in copied] == [0, 0, 1]
        assert len(row2.output["questions"]) == 5


async def test_a_chunk_that_fails_for_good_fails_the_job_and_cancels_the_others(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    source = long_source(paragraphs=40)
    settings = make_settings(
        database_url,
        temporal_address,
        **fake_env(fake, AI_CHUNK_CONCURRENCY=4, AI_INTERACTIVE_CONCURRENCY=4, **SMALL_CALLS),
    )
    async with engine_stack(settings, temporal_client) as st:
        needle = word_only_in_the_last_of_three_chunks(st, source)
        # Chunk 2 is refused for good (a 400: not retried); the others would take a minute.
        await fake.ascript(
            [],
            default={"kind": "slow", "delay_s": 60, "content": quiz_answer(5)},
            rules=[(needle, {"kind": "status", "status": 400})],
        )
        job = await st.create(job_type=QUIZ, input={"sourceText": source})
        row = await st.wait_status(job, timeout=30)
        assert (row.lifecycle_status, row.error_code) == ("failed", "REQUEST_REJECTED")
        calls = await rows(
            st,
            "SELECT chunk_no, error_code FROM ai_usage_log WHERE job_id = :j ORDER BY chunk_no",
            job,
        )
        # One call each; the two in flight were cancelled and recorded so.
        assert [(c.chunk_no, c.error_code) for c in calls] == [
            (0, "CANCELLED"),
            (1, "CANCELLED"),
            (2, "REQUEST_REJECTED"),
        ]
        chunks = await chunk_table(st, job)
        assert [c.status for c in chunks] == ["failed", "failed", "failed"]
        assert chunks[2].error_code == "REQUEST_REJECTED"
