"""Provider limits per (provider, model, key) slow the engine down before the provider answers
429: token and request buckets and a concurrency limit shared by every worker in PostgreSQL,
and what the provider's rate-limit headers announce. Jobs held back stay `queued`, keep their
attempts and wait on their workflow's timer; a dead worker's lease expires; keys never share
buckets; concurrent admissions never over-admit.

The repository is driven directly on real concurrent connections; the engine runs with real
PostgreSQL and Temporal against the scripted OpenAI-compatible server, whose call start times
and in-flight count are what the tests measure.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.client import Client

from db import provider_limits as provider_limits_db
from db.provider_limits import LimitAdmission, LimitKey, Limits
from db.session import SessionMaker
from providers.base import RateLimitHeaders
from providers.crypto import generate_key_setting
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.engine_helpers import scalar
from tests.integration.provider_helpers import FAKE_MODEL, api_client, auth, fake_env
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, Stack, engine_stack, make_settings
from tests.support import eventually

FLASH = "flashcard_generation"
VALID = {"kind": "valid", "content": SCRIPTED[FLASH]}
# The platform provider's name when AI_BASE_URL is not DeepSeek's (providers/factory.py).
PLATFORM_PROVIDER = "openai_compatible"
PLATFORM = LimitKey(PLATFORM_PROVIDER, FAKE_MODEL, "platform")
USER_A_KEY = "sk-user-a-own-key-limits-5e1f"
# Several provider calls at once per worker: only the limiter can keep them apart.
WIDE = {"AI_INTERACTIVE_CONCURRENCY": 4, "AI_BACKGROUND_CONCURRENCY": 4}


def limits_env(limits: dict[str, Any]) -> dict[str, str]:
    return {"AI_MODEL_LIMITS": json.dumps(limits)}


async def admit_once(
    db: SessionMaker, key: LimitKey, limits: Limits, tokens: int = 100, ttl_s: float = 60.0
) -> LimitAdmission:
    async with db.begin() as s:
        return await provider_limits_db.admit(
            s, key, limits, tokens=tokens, job_id=uuid.uuid4(), lease_ttl_s=ttl_s
        )


async def limit_row(db: SessionMaker, key: LimitKey) -> Any:
    async with db() as s:
        return (
            await s.execute(
                text(
                    "SELECT requests_available, tokens_available, announced_rpm, announced_tpm, "
                    "extract(epoch FROM blocked_until) AS blocked_until "
                    "FROM provider_limit WHERE provider = :p AND model = :m AND key_ref = :k"
                ),
                key.params(),
            )
        ).first()


# ---- the repository, on real concurrent connections ------------------------------------------


async def test_concurrent_admissions_never_over_admit_a_bucket(db: SessionMaker) -> None:
    """Twenty callers on their own connections race for an rpm of 5: exactly 5 go, the others
    are told to wait; the same for a concurrency limit of 3 (3 leases)."""
    rpm_key = LimitKey("p", "m", "platform")
    got = await asyncio.gather(*(admit_once(db, rpm_key, Limits(rpm=5)) for _ in range(20)))
    assert sum(a.wait_s == 0 for a in got) == 5
    assert {a.reason for a in got if a.wait_s > 0} == {"rpm"}
    # The sixth request waits for exactly one request's refill (60 s / 5), less what the
    # bucket refilled while the race ran.
    assert all(10.0 < a.wait_s <= 12.0 for a in got if a.wait_s > 0)

    conc_key = LimitKey("p", "m", "key:other")
    got = await asyncio.gather(
        *(admit_once(db, conc_key, Limits(concurrency=3)) for _ in range(20))
    )
    assert sum(a.lease_id is not None for a in got) == 3
    assert {a.reason for a in got if a.lease_id is None} == {"concurrency"}
    assert (
        await scalar(db, "SELECT count(*) FROM provider_call_lease WHERE key_ref = 'key:other'")
        == 3
    )


async def test_token_waits_are_the_exact_refill_and_a_huge_call_is_not_starved(
    db: SessionMaker,
) -> None:
    key = LimitKey("p", "m", "platform")
    limits = Limits(tpm=6000)  # 100 tokens a second
    assert (await admit_once(db, key, limits, tokens=5000)).wait_s == 0
    short = await admit_once(db, key, limits, tokens=3000)
    assert short.reason == "tpm"
    assert 19.0 < short.wait_s <= 20.0  # (3000 - ~1000) / 100 per second

    big = LimitKey("p", "m", "key:big")
    # Larger than the whole bucket: it goes when the bucket is full, and leaves it in debt.
    assert (await admit_once(db, big, limits, tokens=9000)).wait_s == 0
    debt = await admit_once(db, big, limits, tokens=10)
    assert debt.reason == "tpm" and 30.0 < debt.wait_s <= 30.2  # (3000 + 10) / 100


async def test_unused_limits_cost_nothing_and_keys_never_share_buckets(db: SessionMaker) -> None:
    assert await admit_once(db, PLATFORM, Limits()) == LimitAdmission()
    assert await limit_row(db, PLATFORM) is None  # no configured limit: no row written

    exhausted = LimitKey(PLATFORM_PROVIDER, FAKE_MODEL, "key:user-a")
    assert (await admit_once(db, exhausted, Limits(rpm=1))).wait_s == 0
    assert (await admit_once(db, exhausted, Limits(rpm=1))).reason == "rpm"
    assert (await admit_once(db, PLATFORM, Limits(rpm=1))).wait_s == 0


async def test_settle_gives_unused_tokens_back_and_learns_from_headers(db: SessionMaker) -> None:
    key, limits = LimitKey("p", "m", "platform"), Limits(tpm=6000)
    first = await admit_once(db, key, limits, tokens=6000)
    assert first.metered
    async with db.begin() as s:
        await provider_limits_db.settle(
            s, key, None, tokens_reserved=6000, tokens_used=1000, headers=None, limits=limits
        )
    row = await limit_row(db, key)
    assert 5000 <= row.tokens_available <= 6000  # given back, never above the bucket's size

    # Headers of a key nobody configured: the row appears, with what the provider announced.
    quiet = LimitKey("p", "m", "key:quiet")
    headers = RateLimitHeaders(
        limit_requests=60, limit_tokens=1000, remaining_requests=0, reset_requests_s=2.0
    )
    before = time.time()
    async with db.begin() as s:
        await provider_limits_db.settle(
            s, quiet, None, tokens_reserved=0, tokens_used=0, headers=headers
        )
    row = await limit_row(db, quiet)
    assert (row.announced_rpm, row.announced_tpm, row.requests_available) == (60, 1000, 0)
    assert before + 1.5 < float(row.blocked_until) < before + 3
    held = await admit_once(db, quiet, Limits())
    assert held.reason == "announced" and 1.0 < held.wait_s <= 2.0


# ---- the engine --------------------------------------------------------------------------


async def job_tokens(st: Stack, job: uuid.UUID) -> int:
    row = await st.job(job)
    return int((row.estimated_input_tokens or 0) + (row.max_output_tokens or 0))


async def succeeded_once(st: Stack, jobs: list[uuid.UUID], timeout: float = 90) -> None:
    for job in jobs:
        row = await st.wait_status(job, timeout=timeout)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert row.attempt_count == 1  # waiting spent no attempt


@pytest.mark.slow
async def test_a_token_limit_smaller_than_the_load_spreads_the_calls_out(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    """Five jobs' tokens exceed what the token bucket holds: the calls start no sooner than
    the bucket refills for each, nothing answers 429, every job succeeds at its first attempt.
    The bucket starts empty, so the refill rate alone paces them."""
    tpm = 600_000  # 10,000 tokens a second
    # The fake reports every reserved token used: nothing is given back to blur the pacing.
    await fake.ascript([], default={**VALID, "tokens_in": 50_000})
    settings = make_settings(
        database_url,
        temporal_address,
        **fake_env(fake, **limits_env({FAKE_MODEL: {"tpm": tpm}}), **WIDE),
    )
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        async with db.begin() as s:
            t0 = (
                await s.execute(
                    text(
                        "INSERT INTO provider_limit (provider, model, key_ref, "
                        "requests_available, tokens_available, refilled_at) "
                        "VALUES (:p, :m, :k, 'Infinity', 0, clock_timestamp()) "
                        "RETURNING extract(epoch FROM refilled_at)"
                    ),
                    PLATFORM.params(),
                )
            ).scalar_one()
        jobs = [await st.create(job_type=FLASH, input=INPUTS[FLASH]) for _ in range(5)]
        await succeeded_once(st, jobs)
        per_call = await job_tokens(st, jobs[0])
        assert per_call > 1000
        assert [await job_tokens(st, j) for j in jobs] == [per_call] * 5
        starts = sorted((await fake.atimings())["started_at"])
        assert len(starts) == 5
        # Call k (1-based) needs k calls' tokens from a bucket that started empty at t0.
        for k, started in enumerate(starts, start=1):
            assert started >= float(t0) + k * per_call * 60 / tpm - 0.05, (k, starts, t0)
        assert (
            await scalar(db, "SELECT count(*) FROM ai_usage_log WHERE error_code IS NOT NULL") == 0
        )


@pytest.mark.slow
async def test_a_concurrency_limit_of_one_never_has_two_calls_in_flight(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    await fake.ascript([], default={"kind": "slow", "delay_s": 0.6, "content": SCRIPTED[FLASH]})
    settings = make_settings(
        database_url,
        temporal_address,
        **fake_env(fake, **limits_env({"*": {"concurrency": 1}}), **WIDE),
    )
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        jobs = [await st.create(job_type=FLASH, input=INPUTS[FLASH]) for _ in range(4)]
        await succeeded_once(st, jobs)
    assert (await fake.acalls())["count"] == 4
    assert (await fake.atimings())["max_in_flight"] == 1
    assert await scalar(db, "SELECT count(*) FROM provider_call_lease") == 0  # all settled


@pytest.mark.slow
async def test_a_providers_remaining_zero_holds_the_next_call_until_its_reset(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    """No limit configured: the provider's own headers slow the engine down before a 429."""
    exhausted = {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "2s",
    }
    await fake.ascript([{**VALID, "headers": exhausted}], default=VALID)
    settings = make_settings(database_url, temporal_address, **fake_env(fake))
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        first = await st.create(job_type=FLASH, input=INPUTS[FLASH])
        await succeeded_once(st, [first])
        row = await limit_row(db, PLATFORM)
        assert row is not None and row.announced_rpm == 60
        second = await st.create(job_type=FLASH, input=INPUTS[FLASH])
        await succeeded_once(st, [second])
    first_call, second_call = (await fake.atimings())["started_at"]
    assert second_call >= float(row.blocked_until)
    assert second_call - first_call >= 1.9  # ~2 s: the reset the provider announced


@pytest.mark.slow
async def test_a_dead_workers_lease_expires_and_frees_the_slot(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    await fake.ascript([], default=VALID)
    settings = make_settings(
        database_url,
        temporal_address,
        **fake_env(fake, **limits_env({FAKE_MODEL: {"concurrency": 1}})),
    )
    async with db.begin() as s:
        expires = (
            await s.execute(
                text(
                    "INSERT INTO provider_call_lease "
                    "(id, provider, model, key_ref, job_id, tokens, expires_at) "
                    "VALUES (:id, :p, :m, :k, :job, 100, clock_timestamp() + interval '3 seconds') "
                    "RETURNING extract(epoch FROM expires_at)"
                ),
                {**PLATFORM.params(), "id": uuid.uuid4(), "job": uuid.uuid4()},
            )
        ).scalar_one()
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        job = await st.create(job_type=FLASH, input=INPUTS[FLASH])
        await succeeded_once(st, [job], timeout=30)
    [started] = (await fake.atimings())["started_at"]
    assert started >= float(expires)  # held while the lease lived, not a moment longer than
    assert started < float(expires) + 20  # its expiry plus the workflow's backoff
    assert await scalar(db, "SELECT count(*) FROM provider_call_lease") == 0  # swept


@pytest.mark.slow
async def test_one_keys_exhausted_bucket_never_holds_the_platform_keys_jobs(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    await fake.ascript([], default=VALID)
    settings = make_settings(
        database_url,
        temporal_address,
        CREDENTIAL_ENCRYPTION_KEY=generate_key_setting("k1"),
        **fake_env(fake, **limits_env({"*": {"rpm": 1}}), **WIDE),
    )
    async with (
        engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st,
        api_client(settings) as (_, c),
    ):
        added = await c.post(
            "/api/ai/credentials",
            json={"provider": "deepseek", "apiKey": USER_A_KEY},
            headers=auth(settings, "user-a"),
        )
        assert added.status_code == 201, added.text
        body = {
            "jobType": FLASH,
            "targetType": "lesson",
            "targetId": "L-1",
            "input": INPUTS[FLASH],
            "credentialMode": "user_deepseek_key",
        }
        a_jobs = []
        for _ in range(2):
            created = await c.post("/api/ai/jobs", json=body, headers=auth(settings, "user-a"))
            assert created.status_code == 202, created.text
            a_jobs.append(uuid.UUID(created.json()["jobId"]))

        async def a_key_exhausted() -> bool:
            # One of A's jobs took the key's one request of this minute; the other waits.
            rows = [await st.job(j) for j in a_jobs]
            return sorted(r.lifecycle_status for r in rows) == ["queued", "succeeded"]

        await eventually(a_key_exhausted, timeout=30, what="user A's key out of requests")
        started = time.monotonic()
        b_job = await st.create(user_id="user-b", job_type=FLASH, input=INPUTS[FLASH])
        await succeeded_once(st, [b_job], timeout=20)
        assert time.monotonic() - started < 5  # the platform key's own bucket was full
        assert {(await st.job(j)).lifecycle_status for j in a_jobs} == {"queued", "succeeded"}
        key_refs = await scalar(
            db, "SELECT string_agg(key_ref, ',' ORDER BY key_ref) FROM provider_limit"
        )
        assert key_refs.split(",")[0].startswith("key:") and key_refs.endswith("platform")
