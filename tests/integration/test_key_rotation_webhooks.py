"""`aijobs rotate-keys` covers every secret at rest, webhook signing secrets included: after the
documented rotation (prepend a new key, run rotate-keys, drop the old key) deliveries are still
signed with the secrets their owners hold. Real PostgreSQL, the real command (configured from
the environment as in production), a real HTTP receiver on 127.0.0.1.

That every binary column is encrypted and rotated (or declared not secret) is checked without a
server in tests/unit/test_encrypted_columns.py."""

from __future__ import annotations

import argparse
import asyncio

import pytest
from prometheus_client import CollectorRegistry

from activities.metrics import WorkerMetrics
from activities.webhooks import WebhookConfig, WebhookDeliverer
from db.session import SessionMaker
from jobs.webhooks import WebhookService, endpoint_aad
from providers.crypto import CredentialCipher, generate_key_setting
from runtime import cli
from tests.integration.engine_helpers import execute, insert_job, rows
from tests.webhook_helpers import publish_completed, receiver, running, statuses, verified_by

OLD = generate_key_setting("old")
NEW = generate_key_setting("new")
LOST = generate_key_setting("lost")  # a key no ring holds any more


def _service(db: SessionMaker, ring: str) -> WebhookService:
    return WebhookService(
        db, CredentialCipher.from_setting(ring), allow_private=True, rotation_grace_s=3600.0
    )


async def _rotate_keys(monkeypatch: pytest.MonkeyPatch, database_url: str, ring: str) -> int:
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("AIJOBS_ENV", "production")
    monkeypatch.setenv("CREDENTIAL_ENCRYPTION_KEY", ring)
    return await asyncio.to_thread(cli.cmd_rotate_keys, argparse.Namespace())


async def test_after_the_documented_rotation_webhooks_are_still_signed_with_their_secrets(
    db: SessionMaker,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    old_api = _service(db, OLD)
    with receiver() as plain, receiver() as rotated, receiver() as lost:
        # Created under the old key; one of them rotated its secret (previous one in grace).
        _, plain_secret = await old_api.create("u1", plain.url, None)
        endpoint, first_secret = await old_api.create("u2", rotated.url, None)
        _, second_secret = await old_api.rotate("u2", endpoint.id)
        # A previous secret no key of the new ring opens (its key is gone): skipped, not fatal.
        lost_endpoint, lost_secret = await old_api.create("u3", lost.url, None)
        lost_id, lost_blob = CredentialCipher.from_setting(LOST).encrypt(
            "whsec_" + "A" * 44, aad=endpoint_aad(lost_endpoint.id)
        )
        await execute(
            db,
            "UPDATE webhook_endpoint SET previous_key_id = :k, previous_secret_ciphertext = :b, "
            "previous_valid_until = now() + interval '1 hour' WHERE id = :id",
            k=lost_id,
            b=lost_blob,
            id=lost_endpoint.id,
        )

        # 1. The new key goes first in the ring, the old one stays to decrypt; rotate-keys.
        capsys.readouterr()
        assert await _rotate_keys(monkeypatch, database_url, f"{NEW},{OLD}") == 0
        summary = capsys.readouterr().out
        assert "webhook_endpoint.secret_ciphertext: re-encrypted 3" in summary
        assert "webhook_endpoint.previous_secret_ciphertext: re-encrypted 1" in summary
        assert "1 not decryptable (skipped)" in summary
        for secret in (plain_secret, first_secret, second_secret, lost_secret):
            assert secret not in summary and secret.removeprefix("whsec_") not in summary
        keys = await rows(
            db, "SELECT key_id, previous_key_id FROM webhook_endpoint ORDER BY created_at"
        )
        assert [(r.key_id, r.previous_key_id) for r in keys] == [
            ("new", None),
            ("new", "new"),
            ("new", "lost"),
        ]
        assert await _rotate_keys(monkeypatch, database_url, f"{NEW},{OLD}") == 0  # idempotent
        assert "re-encrypted 0" in capsys.readouterr().out

        # 2. The old key is dropped: only the new one is left, and deliveries still verify.
        for user in ("u1", "u2", "u3"):
            await publish_completed(db, await insert_job(db, user))
        config = WebhookConfig(allow_private=True, poll_interval_s=0.05)
        ring = CredentialCipher.from_setting(NEW)
        d = WebhookDeliverer(db, ring, config, metrics=WorkerMetrics(CollectorRegistry()))
        async with running(d):
            [p] = await plain.wait_for(1)
            [r] = await rotated.wait_for(1)
            [q] = await lost.wait_for(1)
    assert verified_by(plain_secret, p)
    assert len(r.headers["webhook-signature"].split(" ")) == 2
    assert verified_by(second_secret, r) and verified_by(first_secret, r)
    assert verified_by(lost_secret, q) and len(q.headers["webhook-signature"].split(" ")) == 1
    for user in ("u1", "u2", "u3"):
        assert await statuses(db, user) == ["delivered"]


async def test_a_current_secret_no_key_opens_fails_the_command_and_touches_nothing(
    db: SessionMaker, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _service(db, OLD).create("u1", "http://127.0.0.1:9/x", None)
    before = await rows(db, "SELECT key_id, secret_ciphertext FROM webhook_endpoint")
    assert await _rotate_keys(monkeypatch, database_url, NEW) == 1  # the old key is missing
    after = await rows(db, "SELECT key_id, secret_ciphertext FROM webhook_endpoint")
    assert [(r.key_id, bytes(r.secret_ciphertext)) for r in after] == [
        (r.key_id, bytes(r.secret_ciphertext)) for r in before
    ]
