"""Users' own provider keys: add (encrypt + store), list, revoke, and key rotation.

The plaintext key exists only inside `add` long enough to be encrypted (AES-GCM under the current
key of CREDENTIAL_ENCRYPTION_KEY, AAD bound to owner and provider, exactly as EXECUTE decrypts
it). One active key per user and provider: adding a key revokes the previous one in the same
transaction, so a job never silently falls back to a key the user meant to replace.
"""

from __future__ import annotations

import logging
import uuid

from db import credentials as credentials_db
from db.credentials import CredentialRow
from db.session import SessionMaker
from engine.errors import CredentialNotFound, CredentialStorageUnavailable, ExecutionFailure
from engine.settings import Settings, current_key_is_development
from providers.crypto import (
    DEV_ENCRYPTION_KEY,
    CredentialCipher,
    credential_aad,
    decrypt_credential,
    mask_key,
)

log = logging.getLogger(__name__)


def credential_cipher(settings: Settings) -> CredentialCipher | None:
    """The one keyring the API encrypts with and the workers decrypt with: the keys of
    CREDENTIAL_ENCRYPTION_KEY; without it, the public development key in development and test
    only, else None (adding keys then answers 503, EXECUTE refuses user-key jobs). Outside
    development and test the development key is never used (ValueError, like a malformed
    setting)."""
    development = settings.environment in ("development", "test")
    raw = settings.credential_encryption_key
    if raw is not None:
        keyring = raw.get_secret_value()
        if not development and current_key_is_development(keyring):
            raise ValueError("CREDENTIAL_ENCRYPTION_KEY is the public development key")
        return CredentialCipher.from_setting(keyring)
    if not development:
        return None
    return CredentialCipher.from_setting(DEV_ENCRYPTION_KEY)


class CredentialService:
    def __init__(self, sessionmaker: SessionMaker, cipher: CredentialCipher | None) -> None:
        self._sm = sessionmaker
        self._cipher = cipher

    async def add(self, user_id: str, provider: str, secret: str) -> CredentialRow:
        if self._cipher is None:
            raise CredentialStorageUnavailable(
                "User keys cannot be stored: no encryption key is set."
            )
        credential_id = uuid.uuid4()
        key_id, blob = self._cipher.encrypt(
            secret, aad=credential_aad(user_id, provider, credential_id)
        )
        async with self._sm.begin() as s:
            for old in await credentials_db.list_for_user(s, user_id):
                if old.provider == provider and old.revoked_at is None:
                    await credentials_db.revoke(s, user_id, old.id)
            row = await credentials_db.add(
                s,
                user_id=user_id,
                provider=provider,
                key_id=key_id,
                ciphertext=blob,
                key_hint=mask_key(secret),
                credential_id=credential_id,
            )
        log.info("credential added", extra={"credential_id": str(row.id)})
        return row

    async def list(self, user_id: str) -> list[CredentialRow]:
        async with self._sm() as s:
            return await credentials_db.list_for_user(s, user_id)

    async def revoke(self, user_id: str, credential_id: uuid.UUID) -> None:
        """Idempotent for the owner; someone else's or a missing key → CredentialNotFound."""
        async with self._sm.begin() as s:
            if not await credentials_db.revoke(s, user_id, credential_id):
                row = await credentials_db.get(s, credential_id)
                if row is None or row.user_id != user_id:
                    raise CredentialNotFound("Credential not found.")
        log.info("credential revoked", extra={"credential_id": str(credential_id)})


async def rotate_credential_keys(
    sessionmaker: SessionMaker, cipher: CredentialCipher
) -> tuple[int, int, int]:
    """Re-encrypt every active user credential whose key id is not the keyring's current one.
    One transaction; the rows are locked (`FOR UPDATE`), so a concurrent revoke waits. Returns
    (rotated, already_current, undecryptable): a row that no key of the ring opens is left as it
    is and reported, never fatal to the others."""
    rotated = current = failed = 0
    async with sessionmaker.begin() as s:
        for row in await credentials_db.all_active(s):
            try:
                plain, bound = decrypt_credential(
                    cipher,
                    credential_id=row.id,
                    user_id=row.user_id,
                    provider=row.provider,
                    key_id=row.key_id,
                    blob=bytes(row.ciphertext),
                )
            except ExecutionFailure:
                failed += 1
                log.warning("credential not decryptable", extra={"credential_id": str(row.id)})
                continue
            if bound and not cipher.needs_rotation(row.key_id):
                current += 1
                continue
            # New key id and/or the row binding of the AAD, with a fresh nonce.
            key_id, blob = cipher.encrypt(
                plain, aad=credential_aad(row.user_id, row.provider, row.id)
            )
            del plain
            await credentials_db.replace_ciphertext(s, row.id, key_id, blob)
            rotated += 1
    return rotated, current, failed
