"""A user's own provider keys: add, list (masked), revoke.

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

from api.deps import CredentialId, State, User
from api.limits import TOO_LARGE_RESPONSE
from api.schemas import Camel
from db.credentials import CredentialRow

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api/ai/credentials", tags=["credentials"])


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
    responses=TOO_LARGE_RESPONSE,
    summary="Add your own provider key",
    description=(
        "Stores the key encrypted; it is used by jobs created with "
        "`credentialMode: user_deepseek_key`. A previous active key of the same provider is "
        "revoked. The key is never returned, only a masked hint."
    ),
)
async def add_credential(body: AddCredentialBody, state: State, principal: User) -> JSONResponse:
    row = await state.credentials.add(
        principal.user_id, body.provider, body.api_key.get_secret_value()
    )
    return JSONResponse(
        _out(row).model_dump(mode="json", by_alias=True),
        status_code=201,
        headers={"Location": f"/api/ai/credentials/{row.id}"},
    )


@router.get("", response_model=CredentialList, summary="List your provider keys (masked)")
async def list_credentials(state: State, principal: User) -> CredentialList:
    rows = await state.credentials.list(principal.user_id)
    return CredentialList(items=[_out(r) for r in rows])


@router.delete(
    "/{credentialId}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Revoke one of your provider keys",
    description="Idempotent for your own keys; someone else's or a missing key → 404.",
)
async def revoke_credential(credential_id: CredentialId, state: State, principal: User) -> Response:
    await state.credentials.revoke(principal.user_id, credential_id)
    return Response(status_code=204)
