"""Flow control from outside (docs/api.md "Flow control", docs/admin.md "Operator pauses"): the
real API over HTTP (in process, and an `aijobs api` subprocess: two API processes on one
database), workers and relay in process, the scriptable OpenAI-compatible fake as the provider,
and AI_MODEL_LIMITS giving its model one concurrent call.

What users depend on: a running job whose call is held is superseded by a second create with its
key (cancelled `SUPERSEDED`, naming the second, its call charged; the second succeeds; two calls);
a job with `ttlSeconds: 3` waiting for the only slot ends `JOB_EXPIRED` while the slot is still
held, with no call; ten debounce creates spread over two processes give one call, for the last,
no sooner than its delay; racing `skip` creates over two processes make one job; an operator
pause on a job type holds its job (queued, no call) while other jobs run, and its DELETE lets it
run once, with the admin in the audit log."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client

from db.session import SessionMaker
from tests.e2e.api_processes import api_processes
from tests.e2e.conftest import Api, assert_problem, start_api
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import FAKE_MODEL, fake_env
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, engine_stack
from tests.support import eventually

CARDS, QUIZ = "flashcard_generation", "quiz_generation"
ALICE, BOB = "alice", "bob"
LIMITS = json.dumps({FAKE_MODEL: {"concurrency": 1}})


def answer(job_type: str = CARDS, **extra: Any) -> dict[str, Any]:
    return {"kind": "valid", "content": SCRIPTED[job_type], "tokens_in": 40, **extra}


def held(job_type: str = CARDS) -> dict[str, Any]:
    """An answer whose stream stops before its first piece until the test releases it."""
    return answer(job_type, hold_at=0)


def body(job_type: str = CARDS, n: int = 0, **extra: Any) -> dict[str, Any]:
    payload = dict(INPUTS[job_type])
    payload["sourceText"] = f"{payload['sourceText']} (version {n})"
    return {
        "jobType": job_type,
        "targetType": "lesson",
        "targetId": "L-1",
        "input": payload,
        **extra,
    }


@contextlib.asynccontextmanager
async def engine_and_api(
    env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> AsyncIterator[Api]:
    settings = env(**fake_env(fake, AI_MODEL_LIMITS=LIMITS))
    async with (
        engine_stack(settings, temporal_client, queues=JOB_QUEUES),
        start_api(settings, temporal=temporal_client) as api,
    ):
        yield api


@contextlib.contextmanager
def second_api(
    database_url: str, temporal_address: str, fake: FakeOpenAIServer, tmp: Path
) -> Iterator[str]:
    env = {k: str(v) for k, v in fake_env(fake, AI_MODEL_LIMITS=LIMITS).items()}
    with api_processes(database_url, temporal_address, tmp, n=1, **env) as (url,):
        yield url


async def post(api: Api, url: str, payload: dict[str, Any], user: str = ALICE) -> httpx.Response:
    return await api.http.post(f"{url}/api/ai/jobs", json=payload, headers=api.as_user(user))


async def usage(api: Api, job: str, user: str = ALICE) -> dict[str, Any]:
    r = await api.http.get(f"/api/ai/jobs/{job}/usage", headers=api.as_user(user))
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def calls(fake: FakeOpenAIServer) -> int:
    return int((await fake.acalls())["count"])


async def call_held(fake: FakeOpenAIServer, n: int = 1) -> None:
    async def holding() -> bool:
        return int((await fake.astreams()).get("held", 0)) >= n

    await eventually(holding, timeout=30, what="the provider to hold a call")


async def test_supersede_aborts_a_running_call_and_a_ttl_expires_behind_the_slot(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    await fake.ascript([held()], default=answer())
    async with engine_and_api(env, temporal_client, fake) as api:
        key = {"key": "notes-1", "mode": "supersede"}
        first = (await api.create(**body(n=1, concurrency=key))).json()["jobId"]
        await call_held(fake)
        await api.wait_status(first, "running")
        second = (await api.create(**body(n=2, concurrency=key))).json()
        assert second["lifecycleStatus"] == "queued"
        assert second["concurrency"] == {**key, "delayMs": None, "maxDelayMs": None}
        old = await api.wait_status(first, "cancelled", timeout=30)
        assert (old["errorCode"], old["supersededBy"]) == ("SUPERSEDED", second["jobId"])
        charged = await usage(api, first)
        assert charged["calls"] == 1 and Decimal(charged["costUsd"]) > 0  # its aborted call
        [call] = charged["attempts"][0]["providerCalls"]
        assert call["costBasis"] == "estimated"
        done = await api.wait_status(second["jobId"], timeout=60)
        assert done["lifecycleStatus"] == "succeeded" and done["supersededBy"] is None
        assert await calls(fake) == 2

        # A TTL shorter than the slot's hold: the job expires waiting, with no call.
        await fake.ascript([held()], default=answer())
        holder = (await api.create(**body(n=3))).json()["jobId"]
        # The fake counts held streams since the test began (a script does not reset it): the
        # superseded call was the first, the holder's is the second.
        await call_held(fake, n=2)
        started = time.monotonic()
        late = (await api.create(BOB, **body(n=4, ttlSeconds=3))).json()
        assert late["expiresAt"] is not None
        gone = await api.wait_status(late["jobId"], "cancelled", user=BOB, timeout=20)
        assert 3.0 <= time.monotonic() - started <= 7.0
        assert (gone["errorCode"], gone["startedAt"]) == ("JOB_EXPIRED", None)
        assert (await api.get(holder))["lifecycleStatus"] == "running"  # the slot still held
        spent = await usage(api, late["jobId"], BOB)
        assert spent["calls"] == 0 and Decimal(spent["costUsd"]) == 0
        await fake.arelease()
        await api.wait_status(holder, timeout=60)
        assert await calls(fake) == 3  # none for the expired job, once the slot freed either


async def test_debounce_and_skip_decide_across_two_api_processes(
    db: SessionMaker,
    env: Any,
    temporal_client: Client,
    fake: FakeOpenAIServer,
    database_url: str,
    temporal_address: str,
    tmp_path: Path,
) -> None:
    await fake.ascript([], default=answer())
    async with engine_and_api(env, temporal_client, fake) as api:
        with second_api(database_url, temporal_address, fake, tmp_path) as other:
            warm = {"jobType": "synthetic", "targetType": "t", "targetId": "1", "input": {}}
            assert (await post(api, other, warm)).status_code == 202
            debounce = {"key": "save", "mode": "debounce", "delayMs": 4000}
            ids, sent = [], []
            for n in range(10):
                url = other if n % 2 else api.base_url
                sent.append(time.time())
                r = await post(api, url, body(n=n, concurrency=debounce))
                assert r.status_code == 202, r.text
                assert time.time() - sent[-1] < 2.0
                ids.append(r.json()["jobId"])
            last = await api.wait_status(ids[-1], timeout=60)
            assert last["lifecycleStatus"] == "succeeded", last
            for older, newer in itertools.pairwise(ids):
                got = await api.get(older)
                assert (got["lifecycleStatus"], got["errorCode"], got["supersededBy"]) == (
                    "cancelled",
                    "SUPERSEDED",
                    newer,
                )
                spent = await usage(api, older)
                assert spent["calls"] == 0 and Decimal(spent["costUsd"]) == 0
            [arrived] = (await fake.atimings())["started_at"]
            assert arrived >= sent[-1] + 4.0, arrived - sent[-1]
            assert "(version 9)" in json.dumps(await fake.amessages())  # the last input ran

            # Six racing skip creates with different inputs: one job.
            await fake.ascript([held()], default=answer())
            skip = {"key": "once", "mode": "skip"}
            racing = await asyncio.gather(
                *(
                    post(api, other if n % 2 else api.base_url, body(n=n, concurrency=skip))
                    for n in range(6)
                )
            )
            assert sorted(r.status_code for r in racing) == [200, 200, 200, 200, 200, 202]
            [job] = {r.json()["jobId"] for r in racing}
            await call_held(fake)
            while_running = await post(api, other, body(QUIZ, n=7, concurrency=skip))
            assert while_running.status_code == 200 and while_running.json()["jobId"] == job
            bobs = await post(api, api.base_url, body(n=8, concurrency=skip), user=BOB)
            assert bobs.status_code == 202 and bobs.json()["jobId"] != job
            unknown = await post(api, other, body(n=9, concurrency={**skip, "mode": "queue"}))
            assert_problem(unknown, 422, "VALIDATION_FAILED")
            assert unknown.json()["errors"][0]["loc"][:2] == ["body", "concurrency"]
            await fake.arelease()
            await api.wait_status(job, timeout=60)
            again = await post(api, api.base_url, body(n=10, concurrency=skip))
            assert again.status_code == 202 and again.json()["jobId"] != job
            await api.wait_status(bobs.json()["jobId"], user=BOB, timeout=60)


async def test_a_pause_holds_one_job_type_until_it_is_deleted(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    await fake.ascript([], default=answer(QUIZ))
    async with engine_and_api(env, temporal_client, fake) as api:
        admin = api.as_admin("ops-admin")
        match = {"jobType": CARDS}
        r = await api.http.post(
            "/admin-api/ai/pauses", json={"match": match, "reason": "bad prompt"}, headers=admin
        )
        assert r.status_code == 201, r.text
        pause = r.json()
        assert pause["createdBy"] == "ops-admin" and pause["expiresAt"] is None
        cards = (await api.create(**body())).json()["jobId"]
        quiz = (await api.create(**body(QUIZ))).json()["jobId"]
        assert (await api.wait_status(quiz, timeout=60))["lifecycleStatus"] == "succeeded"
        assert await calls(fake) == 1  # the quiz's only
        listed = (await api.http.get("/admin-api/ai/pauses", headers=admin)).json()["items"]
        assert [(p["pauseId"], p["reason"]) for p in listed] == [(pause["pauseId"], "bad prompt")]
        assert listed[0]["match"] == {
            "jobType": CARDS,
            "provider": None,
            "model": None,
            "userId": None,
        }
        still = await api.get(cards)
        assert (still["lifecycleStatus"], still["startedAt"]) == ("queued", None)
        await fake.ascript([], default=answer())
        gone = await api.http.delete(f"/admin-api/ai/pauses/{pause['pauseId']}", headers=admin)
        assert gone.status_code == 204
        again = await api.http.delete(f"/admin-api/ai/pauses/{pause['pauseId']}", headers=admin)
        assert_problem(again, 404, "PAUSE_NOT_FOUND")
        assert (await api.wait_status(cards, timeout=30))["lifecycleStatus"] == "succeeded"
        assert await calls(fake) == 2  # the held job ran once
        audit = await api.http.get("/admin-api/ai/audit?action=pause.create", headers=admin)
        [entry] = audit.json()["items"]
        assert (entry["actor"], entry["outcome"], entry["targetId"]) == (
            "ops-admin",
            "paused",
            pause["pauseId"],
        )
        assert entry["detail"]["match"] == match
        deleted = await api.http.get("/admin-api/ai/audit?action=pause.delete", headers=admin)
        assert [(e["actor"], e["outcome"]) for e in deleted.json()["items"]] == [
            ("ops-admin", "PAUSE_NOT_FOUND"),
            ("ops-admin", "resumed"),
        ]
