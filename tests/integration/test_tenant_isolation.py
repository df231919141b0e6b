"""One tenant never degrades another at the provider: a request the provider rejects (400, 413)
and a key's own trouble (402, a 429 on that key) stay with that request or that key, while
another user's jobs run as before; a job held by a closed gate waits in its workflow (no slot, no
attempt, no timeout); a half-open probe is released on every exit path; and a database stall
after the provider answered never buys the answer twice.

Driven by the real HTTP client against the scripted OpenAI-compatible server, with real
PostgreSQL and Temporal.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from db import provider_gate as provider_gate_db
from db.provider_gate import Admission, GateKey
from db.session import SessionMaker
from engine.payloads import DATA_CONVERTER
from providers.crypto import generate_key_setting
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.engine_helpers import scalar
from tests.integration.provider_helpers import PLATFORM_KEY, api_client, auth, fake_env
from tests.job_data import INPUTS, SCRIPTED
from tests.servers import temporal_with
from tests.stack import JOB_QUEUES, Stack, engine_stack, make_settings
from tests.support import eventually

pytestmark = pytest.mark.slow

FLASH = "flashcard_generation"
VALID = {"kind": "valid", "content": SCRIPTED[FLASH]}
# Text only user A's input carries: the fake server's rules answer its calls differently.
POISON = "Zyxwv-tenant-A-marker"
TOO_LONG = {
    "kind": "status",
    "status": 400,
    "message": "This model's maximum context length is 65536 tokens.",
    "code": "context_length_exceeded",
}
USER_A_KEY = "sk-user-a-own-key-77c1d0e5"
# The platform provider's name when AI_BASE_URL is not DeepSeek's (providers/factory.py).
PLATFORM_PROVIDER = "openai_compatible"
# The history length past which the continue-as-new test's server suggests a continue-as-new
# (a job's run passes it at its first wait on the gate; production keeps the server default).
SUGGEST_AFTER = 8


def poisoned() -> dict[str, Any]:
    return {**INPUTS[FLASH], "sourceText": f"{INPUTS[FLASH]['sourceText']} {POISON}"}


async def gate_rows(db: SessionMaker) -> list[Any]:
    async with db() as s:
        rows = await s.execute(
            text(
                "SELECT key_ref, consecutive_failures, open_until, paused_until, probe_until "
                "FROM provider_gate ORDER BY key_ref"
            )
        )
        return list(rows)


async def set_platform_gate(
    db: SessionMaker,
    *,
    consecutive_failures: int = 0,
    open_until: str = "NULL",
    paused_until: str = "NULL",
) -> None:
    """The platform key's gate row as a test starts it (an open breaker, a pause): the two
    timestamps are SQL expressions of this module's own, never input."""
    async with db.begin() as s:
        await s.execute(
            text(
                "INSERT INTO provider_gate "
                "(provider, key_ref, consecutive_failures, open_until, paused_until) "
                f"VALUES (:p, 'platform', :n, {open_until}, {paused_until})"
            ),
            {"p": PLATFORM_PROVIDER, "n": consecutive_failures},
        )


async def timed_job(st: Stack, user: str, timeout: float = 60) -> float:
    """Seconds from create to `succeeded` of one job of `user` on the platform key."""
    started = time.monotonic()
    job = await st.create(user_id=user, job_type=FLASH, input=INPUTS[FLASH])
    row = await st.wait_status(job, timeout=timeout)
    assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
    return time.monotonic() - started


async def test_a_users_rejected_requests_fail_once_and_never_close_the_provider_for_others(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    await fake.ascript([], default=VALID, rules=[(POISON, TOO_LONG)])
    settings = make_settings(
        database_url,
        temporal_address,
        PROVIDER_BREAKER_FAILURES=3,
        PROVIDER_BREAKER_COOLDOWN_S=60,
        **fake_env(fake),
    )
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        baseline = await timed_job(st, "user-b")
        jobs = [
            await st.create(user_id="user-a", job_type=FLASH, input=poisoned()) for _ in range(6)
        ]
        for job in jobs:
            row = await st.wait_status(job, timeout=60)
            assert (row.lifecycle_status, row.error_code) == ("failed", "REQUEST_TOO_LARGE")
            assert row.attempt_count == 1  # the request's own error: one attempt, no retry
            assert "Shorten" in row.public_error_message
        assert (await fake.acalls())["count"] == 1 + 6
        # Six rejected requests in a row (twice the breaker's threshold) opened nothing.
        assert all((g.open_until, g.consecutive_failures) == (None, 0) for g in await gate_rows(db))
        after = await timed_job(st, "user-b")
        # User B's latency did not move: nowhere near the 60 s cooldown an open breaker costs.
        assert after < max(10.0, 5 * baseline), (baseline, after)


async def test_a_user_keys_402_and_429_hold_only_that_keys_jobs(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    await fake.ascript(
        [],
        default=VALID,
        rules=[(USER_A_KEY, {"kind": "rate_limited", "retry_after": "10"})],
    )
    settings = make_settings(
        database_url,
        temporal_address,
        CREDENTIAL_ENCRYPTION_KEY=generate_key_setting("k1"),
        **fake_env(fake),
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
        created = await c.post("/api/ai/jobs", json=body, headers=auth(settings, "user-a"))
        assert created.status_code == 202, created.text
        a_job = uuid.UUID(created.json()["jobId"])

        await eventually(
            lambda: scalar(db, "SELECT count(*) FROM provider_gate WHERE paused_until > now()"),
            timeout=30,
            what="user A's key paused",
        )
        [gate] = await gate_rows(db)
        assert gate.key_ref.startswith("key:")  # the user's key, not the platform's
        # The platform key is not paused: user B's jobs run at once, several of them, while
        # user A's key is still paused.
        for _ in range(3):
            assert await timed_job(st, "user-b", timeout=20) < 5
        assert await scalar(db, "SELECT count(*) FROM provider_gate WHERE paused_until > now()")
        assert (await st.job(a_job)).lifecycle_status in ("queued", "running")
        authorizations = (await fake.acalls())["authorizations"]
        assert authorizations.count(f"Bearer {USER_A_KEY}") == 1  # A's key waits out its pause
        assert authorizations.count(f"Bearer {PLATFORM_KEY}") == 3

        # Now the key is out of balance: the job's retry after the pause fails as the key's
        # problem, and no other key's gate hears of it.
        await fake.ascript(
            [],
            default=VALID,
            rules=[(USER_A_KEY, {"kind": "status", "status": 402, "message": "Insufficient"})],
        )
        row = await st.wait_status(a_job, timeout=60)
        assert (row.lifecycle_status, row.error_code) == (
            "failed",
            "CREDENTIAL_INSUFFICIENT_BALANCE",
        )
        assert "balance" in row.public_error_message
        assert await timed_job(st, "user-b", timeout=20) < 10
        assert all(g.open_until is None for g in await gate_rows(db))


async def test_jobs_held_by_a_long_pause_wait_in_their_workflow_and_spend_nothing(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    """During a pause the held jobs are `queued` at progress 0 with no EXECUTE activity
    pending (no slot held, no start-to-close running): they wait on a workflow timer."""
    await fake.ascript([{"kind": "rate_limited", "retry_after": "12"}], default=VALID)
    settings = make_settings(database_url, temporal_address, **fake_env(fake))
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        first = await st.create(job_type=FLASH, input=INPUTS[FLASH])
        await eventually(
            lambda: scalar(db, "SELECT count(*) FROM provider_gate WHERE paused_until > now()"),
            timeout=30,
            what="a recorded pause",
        )
        held = [await st.create(job_type=FLASH, input=INPUTS[FLASH]) for _ in range(5)]

        async def all_waiting_on_a_timer() -> bool:
            for job in held:
                row = await st.job(job)
                assert (row.lifecycle_status, row.progress) == ("queued", 0)
                try:
                    desc = await temporal_client.get_workflow_handle(row.workflow_id).describe()
                except RPCError as err:
                    if err.status == RPCStatusCode.NOT_FOUND:
                        return False  # the relay has not started this one yet
                    raise
                raw = desc.raw_description
                if raw.pending_activities:
                    return False
            return True

        await eventually(all_waiting_on_a_timer, timeout=20, what="held jobs on a timer")
        assert (await fake.acalls())["count"] == 1
        for job in [first, *held]:
            row = await st.wait_status(job, timeout=60)
            assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert [(await st.job(j)).attempt_count for j in held] == [1] * 5
        assert (await fake.acalls())["count"] == 1 + 1 + 5
        # The job that met the 429 waited too, and called again under the same attempt.
        assert (await st.job(first)).attempt_count == 1
        async with db() as s:
            calls = (
                await s.execute(
                    text(
                        "SELECT attempt_no, error_code FROM ai_usage_log WHERE job_id = :j "
                        "ORDER BY id"
                    ),
                    {"j": first},
                )
            ).all()
        assert [tuple(c) for c in calls] == [(1, "PROVIDER_RATE_LIMITED"), (1, None)]


@pytest.mark.parametrize(
    "probe_outcome",
    ["invalid_json", "content_safety", "request_rejected"],
)
async def test_a_half_open_probe_is_released_whatever_its_attempt_ends_with(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
    probe_outcome: str,
) -> None:
    """The breaker's cooldown is over and the probe's job ends in a way that says nothing
    about the provider's health (or that it answered): the others go at once, not after the
    probe's TTL (the job timeout + 30 s)."""
    steps: list[dict[str, Any]] = []
    if probe_outcome == "invalid_json":
        steps = [{"kind": "invalid_json"}]
    elif probe_outcome == "request_rejected":
        steps = [{"kind": "status", "status": 422, "message": "unknown field"}]
    await fake.ascript(steps, default=VALID)
    settings = make_settings(
        database_url,
        temporal_address,
        AI_INTERACTIVE_CONCURRENCY=1,
        **fake_env(fake),
    )
    await set_platform_gate(db, consecutive_failures=5, open_until="now()")
    async with engine_stack(
        settings, temporal_client, queues=JOB_QUEUES, blocklist=["forbiddenword"]
    ) as st:
        probe_input = (
            {**INPUTS[FLASH], "sourceText": "forbiddenword " + INPUTS[FLASH]["sourceText"]}
            if probe_outcome == "content_safety"
            else INPUTS[FLASH]
        )
        probe = await st.create(job_type=FLASH, input=probe_input)
        await eventually(
            lambda: scalar(
                db,
                "SELECT count(*) FROM ai_usage_log WHERE job_id = :j",
                j=probe,
            ),
            timeout=30,
            what="the probe's attempt",
        )
        # Settled by that attempt, whatever it ended with: nobody waits for the probe's TTL.
        await eventually(
            lambda: scalar(
                db, "SELECT count(*) = 0 FROM provider_gate WHERE probe_until IS NOT NULL"
            ),
            timeout=10,
            what="the probe released",
        )
        if probe_outcome != "content_safety":  # it answered: reachable, the breaker closed
            [gate] = await gate_rows(db)
            assert (gate.open_until, gate.consecutive_failures) == (None, 0)
        started = time.monotonic()
        others = [await st.create(job_type=FLASH, input=INPUTS[FLASH]) for _ in range(2)]
        for job in others:
            row = await st.wait_status(job, timeout=60)
            assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert time.monotonic() - started < 30  # not the probe TTL of 60 + 30 s
        [gate] = await gate_rows(db)
        assert gate.probe_until is None


async def test_a_database_stall_after_the_answer_never_buys_it_twice(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    """EXECUTE heartbeats until its last commit: a table lock that holds its save for several
    heartbeat timeouts does not make Temporal start a second attempt (a second paid call).
    The provider holds the answer until the lock on the usage log is taken: the take before the
    call writes that table too (it charges dead attempts' calls), so the lock comes after it."""
    await fake.ascript([{**VALID, "hold_at": 1}], default=VALID)
    settings = make_settings(
        database_url, temporal_address, AI_HEARTBEAT_TIMEOUT_MS=1000, **fake_env(fake)
    )
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        job = await st.create(job_type=FLASH, input=INPUTS[FLASH])

        async def held() -> bool:
            return bool((await fake.astreams()).get("held", 0) >= 1)

        async def save_waits() -> bool:
            return bool(
                await scalar(
                    db,
                    "SELECT count(*) FROM pg_locks WHERE NOT granted "
                    "AND relation = 'ai_usage_log'::regclass",
                )
            )

        await eventually(held, timeout=30, what="the provider holding the answer")
        async with db.begin() as locker:  # rolled back (the lock released) on leaving
            await locker.execute(text("LOCK TABLE ai_usage_log IN ACCESS EXCLUSIVE MODE"))
            await fake.arelease()
            await eventually(save_waits, timeout=30, what="the save waiting on the lock")
            # The save now waits on the lock for 6 heartbeat timeouts.
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                assert (await fake.acalls())["count"] == 1
                await asyncio.sleep(0.25)
        row = await st.wait_status(job, timeout=60)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert (await fake.acalls())["count"] == 1
        assert row.attempt_count == 1


async def test_a_long_wait_on_the_gate_continues_as_new_and_keeps_its_attempts(
    db: SessionMaker, database_url: str, fake: FakeOpenAIServer
) -> None:
    """Once the server suggests it (its history is long: here past a few events, on a server
    of its own) a waiting run continues as new, so the history stays bounded whatever the
    outage's length; the new run still waits, then runs with no attempt spent."""
    await fake.ascript([], default=VALID)
    await set_platform_gate(db, paused_until="now() + interval '5 seconds'")
    with temporal_with(**{"limit.historyCount.suggestContinueAsNew": SUGGEST_AFTER}) as address:
        client = await Client.connect(address, data_converter=DATA_CONVERTER)
        settings = make_settings(database_url, address, **fake_env(fake))
        async with engine_stack(settings, client, queues=JOB_QUEUES) as st:
            job = await st.create(job_type=FLASH, input=INPUTS[FLASH])
            row = await st.wait_status(job, timeout=60)
            assert row.lifecycle_status == "succeeded", (
                row.error_code,
                row.internal_error_message,
            )
            assert row.attempt_count == 1
            assert (await fake.acalls())["count"] == 1
            desc = await client.get_workflow_handle(row.workflow_id).describe()
            info = desc.raw_description.workflow_execution_info
            assert info.first_run_id and info.first_run_id != desc.run_id  # continued as new


async def test_two_callers_racing_for_a_half_open_probe_get_exactly_one(
    db: SessionMaker,
) -> None:
    """The breaker's cooldown is over and many callers on separate connections ask at once:
    exactly one holds the probe, the others are told to wait; once it is released, exactly one
    of the next round gets it."""
    await set_platform_gate(db, consecutive_failures=5, open_until="now()")
    key = GateKey(PLATFORM_PROVIDER)

    async def ask() -> Admission:
        async with db.begin() as s:
            return await provider_gate_db.admit(s, key, probe_ttl_s=60)

    first = await asyncio.gather(*(ask() for _ in range(8)))
    assert sum(a.probe for a in first) == 1
    assert all(a.wait_s > 0 for a in first if not a.probe)
    async with db.begin() as s:
        await provider_gate_db.release_probe(s, key)
    second = await asyncio.gather(*(ask() for _ in range(8)))
    assert sum(a.probe for a in second) == 1
    async with db.begin() as s:
        await provider_gate_db.reachable(s, key)
    third = await asyncio.gather(*(ask() for _ in range(8)))
    assert all(a.wait_s == 0 and not a.probe for a in third)  # closed: everyone goes
