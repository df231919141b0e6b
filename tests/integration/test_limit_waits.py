"""Jobs waiting for a provider limit, end to end (real PostgreSQL and Temporal, the synthetic
provider under AI_MODEL_LIMITS): they wait in the key's fair queue, are woken when a call ends
(NOTIFY, the waker, a `limit-wake` signal) or at their exact refill time, stay `queued` with no
`startedAt` and no attempt spent, and a large call is not starved by small ones behind it."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from prometheus_client import REGISTRY
from sqlalchemy import text
from temporalio.client import Client

from db.session import SessionMaker
from jobs.types import synthetic
from tests.integration.engine_helpers import scalar
from tests.stack import JOB_QUEUES, Stack, engine_stack, make_settings, variant
from tests.support import eventually

SLOW = {"delayMs": 600}
HOLD = {"delayMs": 8000}
KEY = {"p": "synthetic", "m": "synthetic", "k": "platform"}


def long_source(paragraphs: int = 80) -> str:
    """Distinct sentences, long enough for several chunks of 1,000 tokens."""
    return "\n\n".join(
        f"Paragraph {i} explains that enzyme catalysts{i} accelerate reactions{i} inside "
        f"cells. Researchers measured temperature{i} effects on molecules{i} carefully."
        for i in range(paragraphs)
    )


def limited(database_url: str, temporal_address: str, limits: dict[str, Any]) -> Any:
    return make_settings(
        database_url,
        temporal_address,
        AI_MODEL_LIMITS=json.dumps({"synthetic": limits}),
        AI_INTERACTIVE_CONCURRENCY=4,  # several calls at once per worker: only the limit binds
    )


async def waiting(db: SessionMaker, job: uuid.UUID) -> None:
    async def queued() -> bool:
        return bool(await scalar(db, "SELECT count(*) FROM limit_waiter WHERE job_id = :j", j=job))

    await eventually(queued, timeout=20, what=f"job {job} in the limit queue")


def waits_counted(reason: str) -> float:
    """Waits counted for `reason`, every provider and model."""
    return sum(
        s.value
        for m in REGISTRY.collect()
        for s in m.samples
        if s.name == "aijobs_limiter_waits_total" and s.labels.get("reason") == reason
    )


async def test_waiters_go_in_fair_order_without_polling(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    """Concurrency 1, slow calls: A's first job runs, A's three more wait, then B's two. The
    calls go A1, A2, B1, A3, B2, A4 (each user's first waiter, then each one's second...), each
    woken when the call before it ended; a waiting job is `queued`, has no `startedAt` and has
    spent no attempt, and its wait is counted once."""
    settings = limited(database_url, temporal_address, {"concurrency": 1})
    counted = waits_counted("concurrency")
    async with engine_stack(settings, temporal_client) as st:
        # A1 holds the one slot long enough for the five others to line up behind it, even on
        # a loaded machine (each is awaited into the queue before the next is created).
        a1 = await st.create(user_id="a", input=HOLD)
        await st.wait_status(a1, "running", "succeeded")
        jobs = {"a1": a1}
        for name in ("a2", "a3", "a4", "b1", "b2"):
            jobs[name] = await st.create(user_id=name[0], input=SLOW)
            await waiting(db, jobs[name])
        row = await st.job(jobs["b2"])
        assert (row.lifecycle_status, row.started_at, row.attempt_count) == ("queued", None, 0)
        started = time.monotonic()
        rows = {n: await st.wait_status(j, timeout=30) for n, j in jobs.items()}
        # A1's rest and five calls of 0.6 s one after another; a 60 s backstop was never needed.
        assert time.monotonic() - started < HOLD["delayMs"] / 1000 + 15
    assert {r.lifecycle_status for r in rows.values()} == {"succeeded"}
    assert {r.attempt_count for r in rows.values()} == {1}
    by_start = sorted(rows, key=lambda n: rows[n].started_at)
    assert by_start == ["a1", "a2", "b1", "a3", "b2", "a4"], by_start
    assert waits_counted("concurrency") - counted == 5  # once per waiting job
    assert await scalar(db, "SELECT count(*) FROM limit_waiter") == 0


async def create_stream(st: Stack, jobs: list[uuid.UUID], stop: asyncio.Event) -> None:
    while not stop.is_set():
        jobs.append(await st.create(user_id="small", job_type="synthetic_small"))
        await asyncio.sleep(0.25)


async def test_a_large_call_is_not_starved_by_a_stream_of_small_ones(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    """120,000 tokens a minute (2,000 a second), the bucket empty; a user sends a call of about
    1,100 tokens every 0.25 s (twice what the bucket refills), another one call of about 8,100
    tokens. The large call waits at most its own refill plus one small call ahead of it (about
    4.6 s), however many small calls arrive behind it."""
    tpm = 120_000
    small = variant(synthetic.JOB, "synthetic_small", max_output_tokens=1000)
    large = variant(synthetic.JOB, "synthetic_large", max_output_tokens=8000)
    settings = limited(database_url, temporal_address, {"tpm": tpm})
    async with engine_stack(settings, temporal_client, extra_types=[small, large]) as st:
        async with db.begin() as s:
            await s.execute(
                text(
                    "INSERT INTO provider_limit (provider, model, key_ref, requests_available, "
                    "tokens_available, refilled_at) VALUES (:p, :m, :k, 'Infinity', 0, "
                    "clock_timestamp())"
                ),
                KEY,
            )
        smalls: list[uuid.UUID] = []
        stop = asyncio.Event()
        stream = asyncio.create_task(create_stream(st, smalls, stop))
        try:
            await asyncio.sleep(2.0)  # the small calls already use every token that comes
            big = await st.create(user_id="large", job_type="synthetic_large")
            row = await st.wait_status(big, "running", "succeeded", timeout=30)
        finally:
            stop.set()
            await stream
        created = await scalar(db, "SELECT created_at FROM ai_job WHERE id = :j", j=big)
        need = (row.estimated_input_tokens or 0) + (row.max_output_tokens or 0)
        assert need >= 8000
        waited = (row.started_at - created).total_seconds()
        # Its own refill, one small call ahead of it, and the engine's latency.
        assert waited < (need + 1200) * 60 / tpm + 4, waited


async def test_a_long_sources_chunks_wait_in_the_queue_and_are_woken(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    """A chunked job's fan-out under concurrency 1: its chunks in flight wait in the queue (one
    row each) and a call's end wakes the run, so the job ends without any backstop wait."""
    settings = make_settings(
        database_url,
        temporal_address,
        AI_CHUNK_INPUT_TOKENS=1000,
        AI_MODEL_LIMITS=json.dumps({"*": {"concurrency": 1}}),
        AI_INTERACTIVE_CONCURRENCY=4,
        AI_BACKGROUND_CONCURRENCY=4,
    )
    counted = waits_counted("concurrency")
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        started = time.monotonic()
        job = await st.create(job_type="quiz_generation", input={"sourceText": long_source()})
        row = await st.wait_status(job, timeout=60)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert time.monotonic() - started < 30  # woken, never the 60 s backstop
    assert row.chunk_count is not None and row.chunk_count >= 4
    attempts = await scalar(
        db, "SELECT array_agg(DISTINCT attempt_count) FROM ai_job_chunk WHERE job_id = :j", j=job
    )
    assert attempts == [1]
    assert waits_counted("concurrency") > counted  # chunks did wait for the slot
    assert await scalar(db, "SELECT count(*) FROM limit_waiter") == 0
