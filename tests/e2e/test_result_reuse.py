"""Result reuse from outside: the real API over HTTP, workers and relay in process, and the
scriptable OpenAI-compatible fake as the provider (`AI_BASE_URL`) for the priced model, so every
call it answers is counted and costs money.

What users depend on: a second identical create with `reuse: "allow"` succeeds without a call,
names the job it reused, has artifacts of its own (other rows, same content), no calls in its
usage and cost 0; the same create by another user, or without `reuse: "allow"`, makes its own
call; two identical creates sent at once make one call and both succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import httpx
from temporalio.client import Client
from temporalio.worker import Replayer

from db.session import SessionMaker
from engine.payloads import DATA_CONVERTER
from engine.tiers import REUSE_SOURCE_ENDED_SIGNAL
from runtime.worker import sandbox_runner
from tests.e2e.conftest import Api, start_api
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import FAKE_MODEL, PLATFORM_KEY
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, engine_stack
from workflows.job_workflow import JobWorkflow

CARDS = "flashcard_generation"
ALICE, BOB = "alice", "bob"
ANSWER = {"kind": "valid", "content": SCRIPTED[CARDS], "tokens_in": 40, "tokens_out": 30}


@contextlib.asynccontextmanager
async def engine_and_api(env: Any, temporal_client: Client, base_url: str) -> AsyncIterator[Api]:
    settings = env(
        AI_BASE_URL=base_url,
        USER_KEY_ALLOWED_BASE_URLS=base_url,
        DEEPSEEK_API_KEY=PLATFORM_KEY,
        AI_MODEL=FAKE_MODEL,
    )
    async with (
        engine_stack(settings, temporal_client, queues=JOB_QUEUES),
        start_api(settings, temporal=temporal_client) as api,
    ):
        yield api


async def create(api: Api, user: str = ALICE, **extra: Any) -> httpx.Response:
    body = {"jobType": CARDS, "targetType": "lesson", "targetId": "L-1", "input": INPUTS[CARDS]}
    r = await api.http.post("/api/ai/jobs", json={**body, **extra}, headers=api.as_user(user))
    assert r.status_code == 202, r.text
    return r


async def done(api: Api, job: str, user: str = ALICE) -> dict[str, Any]:
    body = await api.wait_status(job, user=user, timeout=60)
    assert body["lifecycleStatus"] == "succeeded", body
    return body


async def usage(api: Api, job: str, user: str = ALICE) -> dict[str, Any]:
    r = await api.http.get(f"/api/ai/jobs/{job}/usage", headers=api.as_user(user))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def artifacts(api: Api, job: str, user: str = ALICE) -> list[dict[str, Any]]:
    r = await api.http.get(f"/api/ai/jobs/{job}/artifacts", headers=api.as_user(user))
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


async def calls(fake: FakeOpenAIServer) -> int:
    return int((await fake.acalls())["count"])


async def test_a_repeated_create_reuses_the_answer_within_its_user_only(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    await fake.ascript([], default=ANSWER)
    async with engine_and_api(env, temporal_client, fake.base_url) as api:
        first = (await create(api, reuse="allow")).json()["jobId"]
        await done(api, first)
        assert await calls(fake) == 1
        paid = await usage(api, first)
        assert paid["calls"] == 1 and Decimal(paid["costUsd"]) > 0

        again = (await create(api, reuse="allow")).json()
        assert again["reusedFromJobId"] == first
        final = await done(api, again["jobId"])
        assert final["reusedFromJobId"] == first
        assert await calls(fake) == 1  # no provider call
        free = await usage(api, again["jobId"])
        assert free["calls"] == 0 and free["attempts"] == [], free
        assert Decimal(free["costUsd"]) == 0 and Decimal(free["reservedCostUsd"]) == 0
        mine, theirs = await artifacts(api, again["jobId"]), await artifacts(api, first)
        assert len(mine) == len(theirs) > 0
        # Its own rows (other ids), with the same content.
        assert {a["artifactId"] for a in mine}.isdisjoint({a["artifactId"] for a in theirs})
        assert [a["content"] for a in mine] == [a["content"] for a in theirs]

        # Another user asking the same makes its own call; so does a create without reuse.
        bobs = (await create(api, BOB, reuse="allow")).json()
        assert bobs["reusedFromJobId"] is None
        await done(api, bobs["jobId"], BOB)
        assert await calls(fake) == 2
        plain = (await create(api)).json()
        assert plain["reusedFromJobId"] is None
        await done(api, plain["jobId"])
        assert await calls(fake) == 3
        assert (await usage(api, plain["jobId"]))["calls"] == 1


async def test_two_identical_creates_at_once_make_one_call(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    # The call takes long enough that the second job is created while the first runs: it
    # waits for the first one's end (a signal), then copies its answer.
    await fake.ascript([], default={**ANSWER, "kind": "slow", "delay_s": 1.0})
    async with engine_and_api(env, temporal_client, fake.base_url) as api:
        both = await asyncio.gather(*(create(api, reuse="allow") for _ in range(2)))
        ids = [r.json()["jobId"] for r in both]
        sources = [r.json()["reusedFromJobId"] for r in both]
        # One of them is the source, the other reuses it (whichever the user's lock let in first).
        assert sources.count(None) == 1, sources
        root = ids[sources.index(None)]
        reuser = ids[1 - sources.index(None)]
        assert sources[ids.index(reuser)] == root
        for job in ids:
            await done(api, job)
        assert await calls(fake) == 1
        assert (await api.get(reuser))["reusedFromJobId"] == root
        assert (await usage(api, reuser))["calls"] == 0
        # It waited for the source's end on the waker's signal (no poll, no backstop).
        history = await temporal_client.get_workflow_handle(
            (await api.admin_get(reuser))["workflowId"]
        ).fetch_history()
        signals = [
            e.workflow_execution_signaled_event_attributes.signal_name
            for e in history.events
            if e.HasField("workflow_execution_signaled_event_attributes")
        ]
        assert REUSE_SOURCE_ENDED_SIGNAL in signals, signals
        # Its history (the reuse stage, the wait, the signal, PROJECT) replays deterministically.
        await Replayer(
            workflows=[JobWorkflow], workflow_runner=sandbox_runner(), data_converter=DATA_CONVERTER
        ).replay_workflow(history)


async def test_a_reuser_whose_source_is_cancelled_makes_its_own_call(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    # The source's call is slow (it is cancelled during it); every later call answers at once.
    await fake.ascript([{**ANSWER, "kind": "slow", "delay_s": 10.0}], default=ANSWER)
    async with engine_and_api(env, temporal_client, fake.base_url) as api:
        source = (await create(api, reuse="allow")).json()["jobId"]
        await api.wait_status(source, "running")
        reuser = (await create(api, reuse="allow")).json()
        assert reuser["reusedFromJobId"] == source
        r = await api.http.post(f"/api/ai/jobs/{source}/cancel", headers=api.as_user(ALICE))
        assert r.status_code in (200, 202), r.text
        assert (await api.wait_status(source, timeout=30))["lifecycleStatus"] == "cancelled"
        final = await done(api, reuser["jobId"])
        assert final["reusedFromJobId"] is None  # the answer it waited for never came
        assert (await usage(api, reuser["jobId"]))["calls"] == 1
        assert await calls(fake) == 2
