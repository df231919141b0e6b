"""Gentle with every provider: a 429 with Retry-After pauses the provider's calls on every
worker (not only the job that saw it), a provider that keeps failing trips a circuit breaker
that lets one probe through after its cooldown, and jobs waiting on either stay `queued` and
keep their attempts. Driven by the real HTTP client against a scripted OpenAI-compatible
server."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import text
from temporalio.client import Client

from db.session import SessionMaker
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.engine_helpers import scalar
from tests.integration.provider_helpers import fake_env
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, engine_stack, make_settings
from tests.support import eventually

pytestmark = pytest.mark.slow


async def test_a_429_pauses_the_whole_provider_and_every_job_succeeds_after(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    await fake.ascript(
        [{"kind": "rate_limited", "retry_after": "4"}],
        default={"kind": "valid", "content": SCRIPTED["flashcard_generation"]},
    )
    settings = make_settings(database_url, temporal_address, **fake_env(fake))
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        first = await st.create(
            job_type="flashcard_generation", input=INPUTS["flashcard_generation"]
        )

        # The 429 arrives and pauses the provider.
        async def called() -> bool:
            return bool((await fake.acalls())["count"] >= 1)

        await eventually(called, timeout=30, what="the first call")
        await eventually(
            lambda: scalar(db, "SELECT count(*) FROM provider_gate WHERE paused_until > now()"),
            timeout=10,
            what="a recorded pause",
        )
        paused_at = time.monotonic()
        jobs = [
            await st.create(job_type="flashcard_generation", input=INPUTS["flashcard_generation"])
            for _ in range(20)
        ]
        # During the pause: no further calls, and the waiting jobs stay queued (the first one
        # is running: its attempt met the 429 and waits for its retry).
        calls_during_pause = 0
        while time.monotonic() - paused_at < 2.5:
            calls_during_pause = (await fake.acalls())["count"] - 1
            waiting = [await st.job(j) for j in jobs]
            assert all(r.lifecycle_status == "queued" for r in waiting)
            await asyncio.sleep(0.2)
        assert calls_during_pause == 0
        for job in [first, *jobs]:
            row = await st.wait_status(job, timeout=90)
            assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        later = [await st.job(j) for j in jobs]
        assert all(r.attempt_count == 1 for r in later)  # waiting spent no attempt
        assert (await fake.acalls())["count"] == 22  # the 429, the first job's retry, 20 jobs


async def test_a_failing_provider_trips_the_breaker_and_a_probe_closes_it(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    await fake.ascript(
        [{"kind": "status", "status": 503}] * 5,
        default={"kind": "valid", "content": SCRIPTED["flashcard_generation"]},
    )
    # A cooldown shorter than the default 30 s, which the waiting jobs would sleep out whatever
    # the test does (each looks again when its gate's cooldown ends); still well longer than
    # the 2 s in which nobody may call.
    settings = make_settings(
        database_url,
        temporal_address,
        AI_INTERACTIVE_CONCURRENCY=1,
        PROVIDER_BREAKER_COOLDOWN_S=8,
        **fake_env(fake),
    )
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        # Five jobs, each failing once... the fifth failure in a row opens the breaker.
        jobs = [
            await st.create(job_type="flashcard_generation", input=INPUTS["flashcard_generation"])
            for _ in range(6)
        ]
        await eventually(
            lambda: scalar(db, "SELECT count(*) FROM provider_gate WHERE open_until IS NOT NULL"),
            timeout=90,
            interval=0.1,
            what="the breaker to open",
        )
        opened_calls = (await fake.acalls())["count"]
        assert opened_calls == 5
        # Open: nobody calls until the cooldown ends; then one probe succeeds and closes it.
        await asyncio.sleep(2)
        assert (await fake.acalls())["count"] == opened_calls
        async with db.begin() as s:
            await s.execute(text("UPDATE provider_gate SET open_until = now()"))  # cooldown over
        for job in jobs:
            row = await st.wait_status(job, timeout=120)
            assert row.lifecycle_status in ("succeeded", "failed"), row
        async with db() as s:
            gate = (
                await s.execute(text("SELECT consecutive_failures, open_until FROM provider_gate"))
            ).one()
        assert (gate.consecutive_failures, gate.open_until) == (0, None)
        ended = [(await st.job(j)).lifecycle_status for j in jobs]
        assert ended.count("succeeded") >= 1, ended
