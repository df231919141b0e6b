"""A user's own provider keys: add, list (masked), revoke (issue 6).

The plaintext key exists only inside the POST handler, long enough to be encrypted (AES-GCM under
the current key of CREDENTIAL_ENCRYPTION_KEY, AAD bound to the owner and provider, exactly as
the EXECUTE activity decrypts it). No response, log line or error body carries it: responses
show an id, the provider, a masked hint (`sk-…abcd`) and timestamps.

One active key per user and provider: adding a key revokes the previous one in the same
transaction, so a job never silently falls back to a key the user meant to replace.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Response, status
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field, SecretStr, field_validator

from activities.gateway import credential_aad
from api.deps import State, User
from api.schemas import Camel
from db.credentials import CredentialRepository, CredentialRow
from engine.errors import EngineError
from engine.settings import Settings
from providers.crypto import DEV_ENCRYPTION_KEY, CredentialCipher, mask_key

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api/ai/credentials", tags=["credentials"])
_repo = CredentialRepository()


def credential_cipher(settings: Settings) -> CredentialCipher | None:
    """The keyring from CREDENTIAL_ENCRYPTION_KEY; the public development key outside
    production; None in production without a key (adding keys then answers 503)."""
    raw = settings.credential_encryption_key
    if raw is not None:
        return CredentialCipher.from_setting(raw.get_secret_value())
    if settings.environment == "production":
        return None
    return CredentialCipher.from_setting(DEV_ENCRYPTION_KEY)


class CredentialNotFound(EngineError):
    code = "CREDENTIAL_NOT_FOUND"
    http_status = 404
    title = "Credential not found"


class CredentialStorageUnavailable(EngineError):
    code = "CREDENTIAL_STORAGE_UNAVAILABLE"
    http_status = 503
    title = "Credential storage is not configured"


class AddCredentialBody(Camel):
    model_config = ConfigDict(extra="forbid")  # merged with Camel's camelCase aliases

    provider: Literal["deepseek"]
    # SecretStr: the key never shows in a repr, a log line or a validation error.
    api_key: SecretStr = Field(min_length=8, max_length=512)

    @field_validator("api_key")
    @classmethod
    def _printable(cls, v: SecretStr) -> SecretStr:
        if not all("\x21" <= ch <= "\x7e" for ch in v.get_secret_value()):
            raise ValueError("apiKey must be visible ASCII characters without spaces")
        return v


class CredentialOut(Camel):
    id: uuid.UUID
    provider: str
    key_hint: str
    status: Literal["active", "revoked"]
    created_at: datetime
    revoked_at: datetime | None = None


class CredentialList(Camel):
    items: list[CredentialOut]


def _out(row: CredentialRow) -> CredentialOut:
    return CredentialOut(
        id=row.id,
        provider=row.provider,
        key_hint=row.key_hint,
        status="active" if row.revoked_at is None else "revoked",
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=CredentialOut,
    summary="Add your own provider key",
    description=(
        "Stores the key encrypted; it is used by jobs created with "
        "`credentialMode: user_deepseek_key`. A previous active key of the same provider is "
        "revoked. The key is never returned, only a masked hint."
    ),
)
async def add_credential(body: AddCredentialBody, state: State, principal: User) -> JSONResponse:
    cipher = state.cipher
    if cipher is None:
        raise CredentialStorageUnavailable("User keys cannot be stored: no encryption key is set.")
    secret = body.api_key.get_secret_value()
    key_id, blob = cipher.encrypt(secret, aad=credential_aad(principal.user_id, body.provider))
    async with state.sessionmaker.begin() as s:
        for old in await _repo.list_for_user(s, principal.user_id):
            if old.provider == body.provider and old.revoked_at is None:
                await _repo.revoke(s, principal.user_id, old.id)
        row = await _repo.add(
            s,
            user_id=principal.user_id,
            provider=body.provider,
            key_id=key_id,
            ciphertext=blob,
            key_hint=mask_key(secret),
        )
    del secret
    log.info("credential added", extra={"credential_id": str(row.id)})
    return JSONResponse(
        _out(row).model_dump(mode="json", by_alias=True),
        status_code=201,
        headers={"Location": f"/api/ai/credentials/{row.id}"},
    )


@router.get("", response_model=CredentialList, summary="List your provider keys (masked)")
async def list_credentials(state: State, principal: User) -> CredentialList:
    async with state.sessionmaker() as s:
        rows = await _repo.list_for_user(s, principal.user_id)
    return CredentialList(items=[_out(r) for r in rows])


@router.delete(
    "/{credential_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Revoke one of your provider keys",
    description="Idempotent for your own keys; someone else's or a missing key → 404.",
)
async def revoke_credential(credential_id: uuid.UUID, state: State, principal: User) -> Response:
    async with state.sessionmaker.begin() as s:
        if not await _repo.revoke(s, principal.user_id, credential_id):
            row = await _repo.get(s, credential_id)
            if row is None or row.user_id != principal.user_id:
                raise CredentialNotFound("Credential not found.")
    log.info("credential revoked", extra={"credential_id": str(credential_id)})
    return Response(status_code=204)
