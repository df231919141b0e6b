"""Users' own DeepSeek keys: the /api/ai/credentials API, jobs that run with the user's
decrypted key, revocation before and during execution, and key rotation.

The API runs in process (httpx ASGI transport, real lifespan, real PostgreSQL); jobs run on the
real engine against the fake OpenAI-compatible server, which records the bearer token it saw.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from temporalio.client import Client

from db.errors import sqlstate
from db.session import SessionMaker
from engine.errors import ExecutionFailure
from engine.settings import Settings
from jobs.credentials import rotate_credential_keys
from providers.crypto import CredentialCipher, credential_aad, generate_key_setting
from runtime import cli
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.engine_helpers import stage_names, wait_workflow_closed
from tests.integration.provider_helpers import PLATFORM_KEY, api_client, auth, fake_env, usage_rows
from tests.stack import JOB_QUEUES, engine_stack, make_settings
from tests.support import eventually

USER_KEY = "sk-user-owned-key-4f1c9e2ab7d3"
OTHER_KEY = "sk-user-second-key-88aa11bb22cc"
K1 = generate_key_setting("k1")
K2 = generate_key_setting("k2")
QUIZ = {
    "jobType": "quiz_generation",
    "targetType": "lesson",
    "targetId": "L-7",
    "input": {"sourceText": "Ribosomes assemble proteins from amino acids.", "count": 1},
    "credentialMode": "user_deepseek_key",
}
VALID = {
    "questions": [
        {
            "question": "What do ribosomes assemble?",
            "choices": ["Proteins", "Lipids", "Sugars", "DNA"],
            "answer_index": 0,
            "explanation": "Ribosomes assemble proteins from amino acids.",
        }
    ]
}


@pytest.fixture
async def fake_settings(
    db: SessionMaker, database_url: str, temporal_address: str, fake: FakeOpenAIServer
) -> Settings:
    return make_settings(
        database_url, temporal_address, CREDENTIAL_ENCRYPTION_KEY=K1, **fake_env(fake)
    )


async def _add_key(c: httpx.AsyncClient, s: Settings, user: str, key: str) -> dict[str, Any]:
    r = await c.post(
        "/api/ai/credentials", json={"provider": "deepseek", "apiKey": key}, headers=auth(s, user)
    )
    assert r.status_code == 201, r.text
    assert key not in r.text
    body: dict[str, Any] = r.json()
    return body


async def _credential_rows(sm: SessionMaker) -> list[Any]:
    async with sm() as s:
        return list(
            await s.execute(text("SELECT * FROM user_model_credential ORDER BY created_at"))
        )


# ---- the API ------------------------------------------------------------------------------------


async def test_add_list_revoke_own_keys_masked(db: SessionMaker, fake_settings: Settings) -> None:
    s = fake_settings
    async with api_client(s) as (_, c):
        created = await _add_key(c, s, "u1", USER_KEY)
        assert set(created) == {"id", "provider", "keyHint", "status", "createdAt", "revokedAt"}
        assert created["provider"] == "deepseek"
        assert created["keyHint"] == f"sk-…{USER_KEY[-4:]}"
        assert (created["status"], created["revokedAt"]) == ("active", None)

        # Stored encrypted under the current key id, bound to its row, owner and provider.
        [row] = await _credential_rows(db)
        assert (str(row.id), row.user_id, row.key_id) == (created["id"], "u1", "k1")
        assert USER_KEY.encode() not in bytes(row.ciphertext)
        cipher = CredentialCipher.from_setting(K1)
        aad = credential_aad("u1", "deepseek", row.id)
        assert cipher.decrypt(row.key_id, bytes(row.ciphertext), aad=aad) == USER_KEY
        for wrong in (
            credential_aad("u2", "deepseek", row.id),  # another owner
            credential_aad("u1", "deepseek", uuid.uuid4()),  # another row of the same owner
            credential_aad("u1", "deepseek"),  # the older, row-less binding
        ):
            with pytest.raises(ExecutionFailure):
                cipher.decrypt(row.key_id, bytes(row.ciphertext), aad=wrong)

        listed = await c.get("/api/ai/credentials", headers=auth(s, "u1"))
        assert listed.status_code == 200
        assert listed.json()["items"] == [created]
        assert USER_KEY not in listed.text

        # A second key replaces the first (one active key per provider), newest first.
        second = await _add_key(c, s, "u1", OTHER_KEY)
        items = (await c.get("/api/ai/credentials", headers=auth(s, "u1"))).json()["items"]
        assert [(i["id"], i["status"]) for i in items] == [
            (second["id"], "active"),
            (created["id"], "revoked"),
        ]

        # Someone else's keys are invisible and cannot be revoked.
        assert (await c.get("/api/ai/credentials", headers=auth(s, "u2"))).json()["items"] == []
        other = await c.delete(f"/api/ai/credentials/{second['id']}", headers=auth(s, "u2"))
        assert (other.status_code, other.json()["code"]) == (404, "CREDENTIAL_NOT_FOUND")
        missing = await c.delete(f"/api/ai/credentials/{uuid.uuid4()}", headers=auth(s, "u1"))
        assert missing.status_code == 404

        gone = await c.delete(f"/api/ai/credentials/{second['id']}", headers=auth(s, "u1"))
        assert gone.status_code == 204
        again = await c.delete(f"/api/ai/credentials/{second['id']}", headers=auth(s, "u1"))
        assert again.status_code == 204  # idempotent for the owner
        items = (await c.get("/api/ai/credentials", headers=auth(s, "u1"))).json()["items"]
        assert [i["status"] for i in items] == ["revoked", "revoked"]
        assert items[0]["revokedAt"] is not None

        # Input errors never echo the key.
        for body in (
            {"provider": "openai", "apiKey": USER_KEY},
            {"provider": "deepseek", "apiKey": f"{USER_KEY} with spaces"},
            {"provider": "deepseek", "apiKey": "short"},
            {"provider": "deepseek", "apiKey": USER_KEY, "extra": 1},
        ):
            bad = await c.post("/api/ai/credentials", json=body, headers=auth(s, "u1"))
            assert (bad.status_code, bad.json()["code"]) == (422, "VALIDATION_FAILED")
            assert USER_KEY not in bad.text
        unauth = await c.post(
            "/api/ai/credentials", json={"provider": "deepseek", "apiKey": USER_KEY}
        )
        assert unauth.status_code == 401
        assert len(await _credential_rows(db)) == 2


async def test_user_key_mode_without_an_active_key_is_422_at_creation(
    db: SessionMaker, fake_settings: Settings
) -> None:
    s = fake_settings
    async with api_client(s) as (_, c):
        r = await c.post("/api/ai/jobs", json=QUIZ, headers=auth(s, "u1"))
        assert (r.status_code, r.json()["code"]) == (422, "CREDENTIAL_MISSING")
        cred = await _add_key(c, s, "u1", USER_KEY)
        await c.delete(f"/api/ai/credentials/{cred['id']}", headers=auth(s, "u1"))
        r = await c.post("/api/ai/jobs", json=QUIZ, headers=auth(s, "u1"))
        assert (r.status_code, r.json()["code"]) == (422, "CREDENTIAL_MISSING")
    async with db() as session:
        assert await session.scalar(text("SELECT count(*) FROM ai_job")) == 0


# ---- jobs with the user's key -------------------------------------------------------------------


async def test_user_key_job_calls_the_provider_with_the_users_key(
    db: SessionMaker, fake_settings: Settings, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    s = fake_settings
    await fake.ascript([{"kind": "valid", "content": VALID}])
    async with (
        engine_stack(s, temporal_client, queues=JOB_QUEUES) as stack,
        api_client(s) as (_, c),
    ):
        await _add_key(c, s, "u1", USER_KEY)
        created = await c.post("/api/ai/jobs", json=QUIZ, headers=auth(s, "u1"))
        assert created.status_code == 202, created.text
        job_id = uuid.UUID(created.json()["jobId"])
        row = await stack.wait_status(job_id, "succeeded", "failed", timeout=30)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert row.credential_mode == "user_deepseek_key"
        calls = await fake.acalls()
        assert calls["authorizations"] == [f"Bearer {USER_KEY}"]  # not the platform key
        assert PLATFORM_KEY not in str(calls)
        [u] = await usage_rows(stack, job_id)
        assert (u.credential_mode, u.error_code) == ("user_deepseek_key", None)


async def test_key_revoked_between_creation_and_execution_fails_credential_missing(
    db: SessionMaker, fake_settings: Settings, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    s = fake_settings
    await fake.ascript([], default={"kind": "valid", "content": VALID})
    async with api_client(s) as (_, c):  # no workers yet: the job waits in the outbox
        cred = await _add_key(c, s, "u1", USER_KEY)
        created = await c.post("/api/ai/jobs", json=QUIZ, headers=auth(s, "u1"))
        assert created.status_code == 202, created.text
        job_id = uuid.UUID(created.json()["jobId"])
        revoked = await c.delete(f"/api/ai/credentials/{cred['id']}", headers=auth(s, "u1"))
        assert revoked.status_code == 204
    async with engine_stack(s, temporal_client, queues=JOB_QUEUES) as stack:
        row = await stack.wait_status(job_id, "succeeded", "failed", timeout=30)
        assert (row.lifecycle_status, row.error_code) == ("failed", "CREDENTIAL_MISSING")
        assert (await fake.acalls())["count"] == 0
        # RESOLVE found no usable key: the job failed before it took a provider slot, so no
        # attempt was spent and no call was logged.
        assert row.attempt_count == 0
        assert await usage_rows(stack, job_id) == []
        await wait_workflow_closed(temporal_client, row.workflow_id)  # markers written
        history = await temporal_client.get_workflow_handle(row.workflow_id).fetch_history()
        assert "execute" not in stage_names(history)
        assert stage_names(history)[:2] == ["prepare", "resolve"]


async def test_key_revoked_during_a_retry_fails_non_retryable_at_execute(
    db: SessionMaker, fake_settings: Settings, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    """The first call fails (500, retryable); the key is revoked during the 2 s backoff; the
    second EXECUTE finds no active key: CREDENTIAL_MISSING, with no further call."""
    s = fake_settings
    await fake.ascript(
        [{"kind": "status", "status": 500}], default={"kind": "valid", "content": VALID}
    )
    async with (
        engine_stack(s, temporal_client, queues=JOB_QUEUES) as stack,
        api_client(s) as (_, c),
    ):
        cred = await _add_key(c, s, "u1", USER_KEY)
        created = await c.post("/api/ai/jobs", json=QUIZ, headers=auth(s, "u1"))
        job_id = uuid.UUID(created.json()["jobId"])

        async def first_attempt_recorded() -> bool:
            return len(await usage_rows(stack, job_id)) == 1

        await eventually(first_attempt_recorded, timeout=20, what="the first (failed) attempt")
        r = await c.delete(f"/api/ai/credentials/{cred['id']}", headers=auth(s, "u1"))
        assert r.status_code == 204
        # 2 s backoff + one short attempt; generous, yet short enough to fail fast on a hang.
        row = await stack.wait_status(job_id, "succeeded", "failed", timeout=12)
        assert (row.lifecycle_status, row.error_code) == ("failed", "CREDENTIAL_MISSING")
        assert (await fake.acalls())["count"] == 1
        usage = await usage_rows(stack, job_id)
        assert [(u.attempt_no, u.error_code) for u in usage] == [
            (1, "PROVIDER_UNAVAILABLE"),
            (2, "CREDENTIAL_MISSING"),
        ]


# ---- rotation -----------------------------------------------------------------------------------


async def test_rotation_reencrypts_active_keys_under_the_new_key_id(
    db: SessionMaker, fake_settings: Settings, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = fake_settings  # CREDENTIAL_ENCRYPTION_KEY = k1
    async with api_client(s) as (_, c):
        await _add_key(c, s, "u1", USER_KEY)
        await _add_key(c, s, "u2", OTHER_KEY)
        revoked = await _add_key(c, s, "u3", "sk-revoked-before-rotation-1")
        await c.delete(f"/api/ai/credentials/{revoked['id']}", headers=auth(s, "u3"))
    plain = {"u1": USER_KEY, "u2": OTHER_KEY}
    assert {r.key_id for r in await _credential_rows(db)} == {"k1"}

    rotated_ring = CredentialCipher.from_setting(f"{K2},{K1}")
    assert await rotate_credential_keys(db, rotated_ring) == (2, 0, 0)
    rows = {r.user_id: r for r in await _credential_rows(db)}
    old_ring = CredentialCipher.from_setting(K1)
    only_k2 = CredentialCipher.from_setting(K2)
    for user, key in plain.items():
        row = rows[user]
        assert row.key_id == "k2"
        aad = credential_aad(user, "deepseek", row.id)
        assert only_k2.decrypt(row.key_id, bytes(row.ciphertext), aad=aad) == key
        with pytest.raises(ExecutionFailure):
            old_ring.decrypt(row.key_id, bytes(row.ciphertext), aad=aad)
    assert rows["u3"].key_id == "k1"  # revoked keys are left alone
    assert await rotate_credential_keys(db, rotated_ring) == (0, 2, 0)  # idempotent

    # The `aijobs rotate-keys` command, configured from the environment like in production.
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("AIJOBS_ENV", "production")
    k3 = generate_key_setting("k3")
    monkeypatch.setenv("CREDENTIAL_ENCRYPTION_KEY", f"{k3},{K2}")
    assert await asyncio.to_thread(cli.cmd_rotate_keys, argparse.Namespace()) == 0
    rows = {r.user_id: r for r in await _credential_rows(db)}
    k3_ring = CredentialCipher.from_setting(k3)
    for user, key in plain.items():
        aad = credential_aad(user, "deepseek", rows[user].id)
        assert rows[user].key_id == "k3"
        assert k3_ring.decrypt("k3", bytes(rows[user].ciphertext), aad=aad) == key

    # A keyring that lost the key in use: nothing is rewritten, and the command says so.
    monkeypatch.setenv("CREDENTIAL_ENCRYPTION_KEY", generate_key_setting("k4"))
    assert await asyncio.to_thread(cli.cmd_rotate_keys, argparse.Namespace()) == 1
    assert {r.user_id: r.key_id for r in await _credential_rows(db)} == {
        "u1": "k3",
        "u2": "k3",
        "u3": "k1",
    }


# ---- credentialId at create ---------------------------------------------------------------------


async def test_credential_id_names_one_of_the_callers_own_active_keys(
    db: SessionMaker, fake_settings: Settings, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    """The named key is pinned and pays; a revoked one, someone else's and an unknown id are all
    404 CREDENTIAL_NOT_FOUND (nothing tells them apart), and nothing is created for them."""
    s = fake_settings
    await fake.ascript([{"kind": "valid", "content": VALID}])
    async with (
        engine_stack(s, temporal_client, queues=JOB_QUEUES) as stack,
        api_client(s) as (_, c),
    ):
        first = await _add_key(c, s, "u1", USER_KEY)
        second = await _add_key(c, s, "u1", OTHER_KEY)  # revokes `first`
        theirs = await _add_key(c, s, "u2", "sk-someone-elses-key-0099aabbccdd")
        refused: list[dict[str, Any]] = []
        for credential_id in (first["id"], theirs["id"], str(uuid.uuid4())):
            r = await c.post(
                "/api/ai/jobs", json={**QUIZ, "credentialId": credential_id}, headers=auth(s, "u1")
            )
            refused.append(r.json())
            assert (r.status_code, r.json()["code"]) == (404, "CREDENTIAL_NOT_FOUND"), r.text
        assert len({(p["title"], p["detail"]) for p in refused}) == 1  # indistinguishable

        platform = await c.post(
            "/api/ai/jobs",
            json={**QUIZ, "credentialMode": "platform_key", "credentialId": second["id"]},
            headers=auth(s, "u1"),
        )
        assert (platform.status_code, platform.json()["code"]) == (422, "VALIDATION_FAILED")
        async with db() as session:
            assert await session.scalar(text("SELECT count(*) FROM ai_job")) == 0

        created = await c.post(
            "/api/ai/jobs", json={**QUIZ, "credentialId": second["id"]}, headers=auth(s, "u1")
        )
        assert created.status_code == 202, created.text
        job_id = uuid.UUID(created.json()["jobId"])
        row = await stack.wait_status(job_id, timeout=30)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert str(row.credential_id) == second["id"]
        assert (await fake.acalls())["authorizations"] == [f"Bearer {OTHER_KEY}"]


async def test_a_key_a_job_names_cannot_be_deleted(
    db: SessionMaker, fake_settings: Settings
) -> None:
    """ai_job.credential_id references the key ON DELETE RESTRICT: keys are revoked, never
    deleted, and a job keeps naming the key it was charged to."""
    s = fake_settings
    async with api_client(s) as (_, c):
        cred = await _add_key(c, s, "u1", USER_KEY)
        created = await c.post(
            "/api/ai/jobs", json={**QUIZ, "credentialId": cred["id"]}, headers=auth(s, "u1")
        )
        assert created.status_code == 202, created.text
    with pytest.raises(DBAPIError) as raised:
        async with db.begin() as session:
            await session.execute(
                text("DELETE FROM user_model_credential WHERE id = :id"), {"id": cred["id"]}
            )
    assert sqlstate(raised.value) == "23001"  # restrict_violation
    with pytest.raises(DBAPIError) as raised:  # and a job cannot name a key that is not there
        async with db.begin() as session:
            await session.execute(
                text("UPDATE ai_job SET credential_id = :id"), {"id": uuid.uuid4()}
            )
    assert sqlstate(raised.value) == "23503"  # foreign_key_violation
