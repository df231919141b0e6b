"""Keys never leak: a platform key and a user key, both unique sentinels,
go through successes, retries and failures whose provider error bodies echo the key back; then
neither sentinel may appear in the captured logs (DEBUG), the jobs' Temporal histories, any
engine table (ai_job, snapshots, usage, outbox, artifacts, credentials), or any API response.

The fake server must have seen both keys: that is what makes the absence meaningful.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from temporalio.client import Client

from db.session import SessionMaker
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import api_client, auth, fake_env
from tests.stack import JOB_QUEUES, engine_stack, make_settings

PLATFORM_SENTINEL = f"sk-platform-SENTINEL-{secrets.token_hex(12)}"
USER_SENTINEL = f"sk-user-SENTINEL-{secrets.token_hex(12)}"
SENTINELS = (PLATFORM_SENTINEL, USER_SENTINEL)
VALID = {"flashcards": [{"front": "What do ribosomes do?", "back": "They assemble proteins."}]}
TABLES = (
    "ai_job",
    "ai_job_snapshot",
    "ai_job_artifact",
    "ai_usage_log",
    "outbox_event",
    "user_model_credential",
    "flashcard",
)


def _fragments(secret: str) -> list[str]:
    """The key and every 12-character piece of it: a partial echo is a leak too (a masked hint
    shows 4 characters, so 12 never match legitimately)."""
    return [secret] + [secret[i : i + 12] for i in range(0, len(secret) - 11, 4)]


def _assert_clean(where: str, blob: str) -> None:
    for secret in SENTINELS:
        for fragment in _fragments(secret):
            assert fragment not in blob, f"key material {fragment!r} found in {where}"


async def test_keys_never_leak(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = make_settings(
        database_url,
        temporal_address,
        **fake_env(fake, DEEPSEEK_API_KEY=PLATFORM_SENTINEL),
    )
    responses: list[httpx.Response] = []
    source = {"sourceText": "Ribosomes assemble proteins. Mitochondria make ATP.", "count": 1}
    # Every failing step echoes the key the provider received, as some real providers do.
    await fake.ascript(
        [
            # platform job: a 500 echoing the key, then success on the retry
            {"kind": "status", "status": 500, "message": f"upstream saw {PLATFORM_SENTINEL}"},
            {"kind": "valid", "content": VALID},
            # user job: a 401 echoing the key (non-retryable)
            {
                "kind": "status",
                "status": 401,
                "message": f"Incorrect API key provided: {USER_SENTINEL}. Check it.",
                "code": "invalid_api_key",
            },
            # platform job: a 429 echoing the key, then success
            {"kind": "status", "status": 429, "retry_after": "1", "message": PLATFORM_SENTINEL},
        ],
        default={"kind": "valid", "content": VALID},
    )
    async with (
        engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack,
        api_client(settings) as (_, c),
    ):
        user, admin = auth(settings, "u1"), auth(settings, "root", admin=True)

        async def call(method: str, url: str, **kw: Any) -> httpx.Response:
            r = await c.request(method, url, **kw)
            responses.append(r)
            return r

        body = {"jobType": "flashcard_generation", "targetType": "lesson", "targetId": "L-1"}
        first = await call("POST", "/api/ai/jobs", json={**body, "input": source}, headers=user)
        platform_job = uuid.UUID(first.json()["jobId"])
        row = await stack.wait_status(platform_job, "succeeded", "failed", timeout=30)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)

        cred = await call(
            "POST",
            "/api/ai/credentials",
            json={"provider": "deepseek", "apiKey": USER_SENTINEL},
            headers=user,
        )
        assert cred.status_code == 201
        user_job_r = await call(
            "POST",
            "/api/ai/jobs",
            json={**body, "input": source, "credentialMode": "user_deepseek_key"},
            headers=user,
        )
        user_job = uuid.UUID(user_job_r.json()["jobId"])
        row = await stack.wait_status(user_job, "succeeded", "failed", timeout=30)
        assert (row.lifecycle_status, row.error_code) == ("failed", "CREDENTIAL_INVALID")
        assert "HTTP 401" in (row.internal_error_message or "")  # the body was kept, scrubbed

        third = await call(
            "POST",
            "/api/ai/jobs",
            json={**body, "input": {**source, "count": 2}},
            headers=user,
        )
        rate_limited_job = uuid.UUID(third.json()["jobId"])
        row = await stack.wait_status(rate_limited_job, "succeeded", "failed", timeout=30)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)

        # A key sent with invalid input is not echoed either.
        bad = await call(
            "POST",
            "/api/ai/credentials",
            json={"provider": "deepseek", "apiKey": f"{USER_SENTINEL} trailing"},
            headers=user,
        )
        assert bad.status_code == 422
        job_ids = (platform_job, user_job, rate_limited_job)
        for job_id in job_ids:
            await call("GET", f"/api/ai/jobs/{job_id}", headers=user)
            detail = await call("GET", f"/admin-api/ai/jobs/{job_id}", headers=admin)
            assert detail.status_code == 200, detail.text
        await call("GET", "/api/ai/jobs", headers=user)
        await call("GET", "/admin-api/ai/jobs", headers=admin)
        await call("GET", "/api/ai/credentials", headers=user)
        await call("DELETE", f"/api/ai/credentials/{cred.json()['id']}", headers=user)
        await call("GET", "/api/ai/credentials", headers=user)

        # The keys really went out (else the checks below prove nothing).
        seen = (await fake.acalls())["authorizations"]
        assert seen.count(f"Bearer {PLATFORM_SENTINEL}") == 4
        assert seen.count(f"Bearer {USER_SENTINEL}") == 1

        for job_id in job_ids:
            row = await stack.job(job_id)
            history = await temporal_client.get_workflow_handle(row.workflow_id).fetch_history()
            _assert_clean(f"Temporal history of {row.workflow_id}", history.to_json())

    async with db() as s:
        for table in TABLES:
            dump = await s.scalar(
                text(
                    f"SELECT coalesce(string_agg(row_to_json(t)::text, E'\\n'), '') FROM {table} t"
                )
            )
            assert dump or table in ("ai_job_artifact", "flashcard")
            _assert_clean(f"table {table}", dump)
            for secret in SENTINELS:  # nor stored as raw bytes (bytea shows as hex)
                assert secret.encode().hex() not in dump, f"plaintext key bytes in {table}"

    for r in responses:
        _assert_clean(f"response to {r.request.method} {r.request.url.path}", r.text)
        _assert_clean("response headers", str(dict(r.headers)))

    assert caplog.records, "nothing was logged: the log check would prove nothing"
    _assert_clean("captured log text", caplog.text)
    for record in caplog.records:
        _assert_clean(f"log record {record.name} (fields)", repr(record.__dict__))
