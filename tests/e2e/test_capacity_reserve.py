"""Capacity reserved for interactive calls on a shared key, end to end (AI_CAPACITY_RESERVE,
docs/limits.md): the real API, workers for both job queues, the limit waker, and an
OpenAI-compatible mock answering the priced model, limited to 4 calls at once.

Twenty users' weak-point jobs (background) fill the key's 4 slots, their calls held by the
provider and ending one every 0.5 s; another user's flashcard job (interactive) then starts its
call within 3 s of what a lone one takes on the same stack, with at most 2 background calls
reaching the provider between its create and its call: the first slot that frees is its own,
ahead of every background call waiting, whatever their users' turns.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from temporalio.client import Client

from db.session import SessionMaker
from tests.e2e.conftest import Api, start_api
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import FAKE_MODEL, PLATFORM_KEY
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, engine_stack
from tests.support import eventually

pytestmark = pytest.mark.slow

FLASH, WEAK = "flashcard_generation", "weak_point_analysis"
# The flashcard jobs' source carries this mark: the mock answers them at once (a rule).
MARK = "Interactive-mark-7f3a."


def settings(env: Any, base_url: str) -> Any:
    return env(
        AI_BASE_URL=base_url,
        DEEPSEEK_API_KEY=PLATFORM_KEY,
        AI_MODEL=FAKE_MODEL,
        AI_MODEL_LIMITS=f'{{"{FAKE_MODEL}": {{"concurrency": 4}}}}',
        AI_CAPACITY_RESERVE='{"interactive": 0.25}',
        AI_INTERACTIVE_CONCURRENCY=8,
        AI_BACKGROUND_CONCURRENCY=8,
    )


async def create(api: Api, user: str, job_type: str) -> str:
    data = dict(INPUTS[job_type])
    if job_type == FLASH:
        data["sourceText"] = f"{MARK} {data['sourceText']}"
    r = await api.http.post(
        "/api/ai/jobs",
        json={"jobType": job_type, "targetType": "lesson", "targetId": "L1", "input": data},
        headers=api.as_user(user),
    )
    assert r.status_code == 202, r.text
    return str(r.json()["jobId"])


async def call_started(api: Api, job: str, user: str) -> tuple[float, float]:
    """When the job was created and when its call was admitted (the commit that made it
    `running`), epoch seconds of the database's clock."""
    done = await api.wait_status(job, user=user, timeout=60)
    assert done["lifecycleStatus"] == "succeeded", done
    return (
        dt.datetime.fromisoformat(done["createdAt"]).timestamp(),
        dt.datetime.fromisoformat(done["startedAt"]).timestamp(),
    )


async def test_an_interactive_call_takes_the_first_slot_background_calls_free(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    # Background calls end 0.5, 1.0, 1.5, 2.0 s after they start, then each lasts 2 s: with 4
    # at once, one ends every 0.5 s. Flashcard calls are answered at once.
    weak = {"kind": "slow", "content": SCRIPTED[WEAK], "tokens_in": 50, "tokens_out": 50}
    await fake.ascript(
        [{**weak, "delay_s": 0.5 * (i + 1)} for i in range(4)],
        default={**weak, "delay_s": 2.0},
        rules=[(MARK, {"kind": "valid", "content": SCRIPTED[FLASH]})],
    )
    s = settings(env, fake.base_url)
    async with (
        engine_stack(s, temporal_client, queues=JOB_QUEUES),
        start_api(s, temporal=temporal_client) as api,
    ):
        created, started = await call_started(api, await create(api, "lone", FLASH), "lone")
        lone = started - created
        # Twenty users' weak-point jobs: four calls at the provider, sixteen waiting for a slot.
        await asyncio.gather(*(create(api, f"student-{i}", WEAK) for i in range(20)))

        async def full() -> bool:
            return len((await fake.atimings())["started_at"]) >= 1 + 4

        await eventually(full, timeout=30, what="the background calls to fill the key")
        job = await create(api, "teacher", FLASH)
        created, started = await call_started(api, job, "teacher")
        calls = (await fake.atimings())["started_at"]
        between = [t for t in calls if created < t < started]
        assert started - created <= lone + 3.0, (started - created, lone)
        assert len(between) <= 2, (between, created, started)
        # The key never had more than its 4 calls at once.
        assert (await fake.atimings())["max_in_flight"] <= 4
