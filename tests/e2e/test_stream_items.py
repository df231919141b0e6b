"""Items while the model is still writing, over real HTTP: an OpenAI-compatible mock streams a
one-call quiz's answer and holds its last piece until the test lets it go, so the ordering
"first item event before the provider's last byte" is decided by the test, not by sleeps. A
stream cut after two items fails the attempt, is charged, and its items are retracted before
the retry's replace them; a JSON body answering a streamed request still yields the items."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.client import Client

from db.session import SessionMaker
from jobs.chunk_items import ITEM_RETRACTED
from tests.e2e.conftest import Api, start_api
from tests.e2e.follow import Follow, all_artifacts
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import fake_env, usage_rows
from tests.stack import Stack, engine_stack
from tests.support import eventually

pytestmark = pytest.mark.slow

QUIZ = "quiz_generation"
SOURCE = "Enzymes are catalysts. They speed reactions up. Temperature changes their shape."
PIECE = 40  # characters per streamed piece


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


def pieces_of(content: dict[str, Any]) -> int:
    """How many content pieces the mock sends for `content` (its `chunk_chars` slicing)."""
    return -(-len(json.dumps(content)) // PIECE)


@contextlib.asynccontextmanager
async def stack_of(
    env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> AsyncIterator[tuple[Api, Stack]]:
    settings = env(**fake_env(fake))
    async with engine_stack(settings, temporal_client) as stack, start_api(settings) as api:
        yield api, stack


async def create_quiz(api: Api) -> str:
    return await api.create_id(jobType=QUIZ, input={"sourceText": SOURCE, "count": 4})


async def test_the_first_item_arrives_before_the_provider_ends_its_answer(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    content = answer("s", 4)
    last = pieces_of(content) - 1
    step = {
        "kind": "valid",
        "content": content,
        "chunk_chars": PIECE,
        "hold_at": last,  # the last piece waits for the test
        "tokens_in": 321,
        "tokens_out": 654,
    }
    await fake.ascript([step])
    async with stack_of(env, temporal_client, fake) as (api, stack):
        job_id = await create_quiz(api)
        follow = Follow(api, job_id)
        try:
            await follow.until(lambda: len(follow.items()) >= 3, "three items", timeout=60)
            # The provider has not written its last byte: it is held until released below.
            streams = await fake.astreams()
            assert streams["stream"] == [True] and streams["include_usage"] == [True]
            assert streams["held"] == 1 and streams["ends"] == []
            # The partial results show the same items while the call runs.
            partial = await all_artifacts(api, job_id)
            assert [a["final"] for a in partial] == [False] * len(partial) and len(partial) >= 3
            assert partial[0]["content"]["question"] == "Question s-0?"
            await fake.arelease()
            await follow.until(lambda: follow.closed, "the stream to end", timeout=60)
        finally:
            await follow.stop()
        job = await api.get(job_id)
        final = await all_artifacts(api, job_id)
        usage = await usage_rows(stack, uuid.UUID(job_id))
    assert job["lifecycleStatus"] == "succeeded"
    items = follow.items()
    assert [i["ordinal"] for i in items] == [0, 1, 2, 3]
    assert {i["chunk"] for i in items} == {0} and all(i["jobId"] == job_id for i in items)
    assert [i["content"]["question"] for i in items] == [f"Question s-{n}?" for n in range(4)]
    assert set(items[0]["content"]) == {"question", "choices", "answerIndex", "explanation"}
    assert not [e for e in follow.events if e.event == ITEM_RETRACTED]
    kinds = [e.event for e in follow.events]
    assert kinds.index("item") < len(kinds) - 1 and kinds[-1] == "status"
    assert [a["content"]["question"] for a in final] == [f"Question s-{n}?" for n in range(4)]
    # The usage of the stream's final chunk.
    assert [(u.tokens_in, u.tokens_out, u.cost_basis) for u in usage] == [(321, 654, "reported")]


async def test_a_stream_cut_after_two_items_is_charged_and_its_items_replaced(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    first, second = answer("a", 4), answer("b", 4)
    # Two questions are whole once the third has started: cut there (no finish, no [DONE]).
    text = json.dumps(first)
    third = text.index('{"question": "Question a-2?')
    cut_after = third // PIECE + 1
    steps = [
        {
            "kind": "valid",
            "content": first,
            "chunk_chars": PIECE,
            "cut_after": cut_after,
            "hold_at": cut_after,  # the cut waits until the client has both items
        },
        {"kind": "valid", "content": second, "chunk_chars": PIECE},
    ]
    await fake.ascript(steps)
    async with stack_of(env, temporal_client, fake) as (api, stack):
        job_id = await create_quiz(api)
        follow = Follow(api, job_id)
        try:
            await follow.until(lambda: len(follow.items()) == 2, "two items", timeout=60)
            await fake.arelease()
            await follow.until(lambda: follow.closed, "the stream to end", timeout=90)
        finally:
            await follow.stop()
        job = await api.get(job_id)
        final = await all_artifacts(api, job_id)
        usage = await usage_rows(stack, uuid.UUID(job_id))
    assert job["lifecycleStatus"] == "succeeded", job
    assert (await fake.astreams())["ends"] == ["cut", "complete"]
    # The cut attempt: failed as the provider's, charged for the prompt and what it received.
    assert [(u.attempt_no, u.error_code) for u in usage] == [(1, "PROVIDER_UNAVAILABLE"), (2, None)]
    cut = usage[0]
    assert cut.cost_basis == "estimated" and cut.cost_usd > 0 and cut.tokens_out > 0
    # Its two items were shown, then retracted before the retry's four.
    seq = [(e.event, e.data.get("ordinal")) for e in follow.events if e.event != "status"]
    assert seq[:4] == [("item", 0), ("item", 1), (ITEM_RETRACTED, 0), (ITEM_RETRACTED, 1)], seq
    assert seq[4:] == [("item", n) for n in range(4)], seq
    shown = [e.data["content"]["question"] for e in follow.events if e.event == "item"]
    assert shown[:2] == ["Question a-0?", "Question a-1?"]
    assert shown[2:] == [f"Question b-{n}?" for n in range(4)]
    assert [a["content"]["question"] for a in final] == [f"Question b-{n}?" for n in range(4)]


async def test_a_json_body_answering_a_streamed_request_still_gives_its_items(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    await fake.ascript([{"kind": "valid", "content": answer("j", 4), "stream_json": True}])
    async with stack_of(env, temporal_client, fake) as (api, _stack):
        job_id = await create_quiz(api)
        follow = Follow(api, job_id)
        try:
            await follow.until(lambda: follow.closed, "the stream to end", timeout=60)
        finally:
            await follow.stop()
        final = await all_artifacts(api, job_id)
        job = await api.get(job_id)
    assert job["lifecycleStatus"] == "succeeded", job
    assert (await fake.astreams())["stream"] == [True]
    assert [i["ordinal"] for i in follow.items()] == [0, 1, 2, 3]
    assert len(final) == 4


async def test_items_of_an_answer_the_final_validation_rejects_are_retracted(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    # 21 questions: each valid on its own, the answer not (at most 20).
    rejected, good = answer("x", 21), answer("g", 4)
    steps = [
        {
            "kind": "valid",
            "content": rejected,
            "chunk_chars": PIECE,
            "hold_at": pieces_of(rejected) - 1,
        },
        {"kind": "valid", "content": good, "chunk_chars": PIECE},
    ]
    await fake.ascript(steps)
    async with stack_of(env, temporal_client, fake) as (api, stack):
        job_id = await create_quiz(api)
        follow = Follow(api, job_id)
        try:
            await follow.until(lambda: len(follow.items()) >= 3, "three items", timeout=60)
            await fake.arelease()
            await follow.until(lambda: follow.closed, "the stream to end", timeout=90)
        finally:
            await follow.stop()
        job = await api.get(job_id)
        usage = await usage_rows(stack, uuid.UUID(job_id))
    assert job["lifecycleStatus"] == "succeeded", job
    assert [u.error_code for u in usage] == ["VALIDATION_OUTPUT_INVALID", None]
    events = [e for e in follow.events if e.event != "status"]
    shown = [e.data["ordinal"] for e in events if e.event == "item"]
    first = [e.data["ordinal"] for e in events if e.event == "item"][: len(shown) - 4]
    taken = [e.data["ordinal"] for e in events if e.event == ITEM_RETRACTED]
    # Every item of the rejected answer that was shown is taken back, before the retry's come.
    assert len(first) >= 3 and sorted(taken) == sorted(first)
    last_retraction = max(i for i, e in enumerate(events) if e.event == ITEM_RETRACTED)
    retry = [e.data["content"]["question"] for e in events[last_retraction + 1 :]]
    assert retry == [f"Question g-{n}?" for n in range(4)]


async def test_a_cancel_mid_stream_closes_the_call_charges_it_and_takes_its_items_back(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    content = answer("c", 4)
    await fake.ascript([{"kind": "valid", "content": content, "chunk_chars": PIECE, "hold_at": 8}])
    async with stack_of(env, temporal_client, fake) as (api, stack):
        job_id = await create_quiz(api)
        follow = Follow(api, job_id)
        try:
            await follow.until(lambda: len(follow.items()) >= 2, "two items", timeout=60)
            r = await api.cancel(job_id)
            assert r.status_code == 202, r.text
            await follow.until(lambda: follow.closed, "the stream to end", timeout=60)
        finally:
            await follow.stop()
        job = await api.get(job_id)
        usage = await usage_rows(stack, uuid.UUID(job_id))
        partial = await all_artifacts(api, job_id)

        async def connection_closed() -> bool:
            return bool((await fake.astreams())["ends"] == ["client_gone"])

        await eventually(connection_closed, timeout=10, what="the provider's stream to close")
    assert job["lifecycleStatus"] == "cancelled", job
    # Charged for the prompt and what it received, before the job ended.
    assert [(u.error_code, u.cost_basis) for u in usage] == [("CANCELLED", "estimated")]
    assert usage[0].cost_usd > 0
    shown = sorted(i["ordinal"] for i in follow.items())
    taken = sorted(e.data["ordinal"] for e in follow.events if e.event == ITEM_RETRACTED)
    assert taken == shown and len(shown) >= 2
    assert follow.events[-1].event == "status" and partial == []
