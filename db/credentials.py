"""`user_model_credential`: users' own provider keys, stored only as AES-GCM ciphertext."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession


@dataclass(frozen=True)
class CredentialRow:
    id: uuid.UUID
    user_id: str
    provider: str
    key_id: str
    ciphertext: bytes
    key_hint: str
    created_at: datetime
    revoked_at: datetime | None


_COLS = "id, user_id, provider, key_id, ciphertext, key_hint, created_at, revoked_at"


async def active_user_key_id(session: AsyncSession, user_id: str) -> uuid.UUID | None:
    """The id of a user's usable own DeepSeek key, pinned on a job when it is created."""
    row = await active_for_user(session, user_id, "deepseek")
    return row.id if row else None


async def owned_active_key_id(
    session: AsyncSession, user_id: str, credential_id: uuid.UUID
) -> uuid.UUID | None:
    """`credential_id` when it is `user_id`'s own active DeepSeek key, else None: someone
    else's, a revoked and a missing key look the same to the caller. The row is read FOR SHARE,
    so a revoke waits for the transaction that pins the key on a job."""
    row = (
        await session.execute(
            text(
                """
                SELECT id FROM user_model_credential
                WHERE id = :id AND user_id = :u AND provider = 'deepseek' AND revoked_at IS NULL
                FOR SHARE
                """
            ),
            {"id": credential_id, "u": user_id},
        )
    ).first()
    return row.id if row else None


async def add(
    session: AsyncSession,
    *,
    user_id: str,
    provider: str,
    key_id: str,
    ciphertext: bytes,
    key_hint: str,
    credential_id: uuid.UUID | None = None,
) -> CredentialRow:
    row = (
        await session.execute(
            text(
                f"""
                INSERT INTO user_model_credential (id, user_id, provider, key_id, ciphertext,
                    key_hint, created_at)
                VALUES (:id, :u, :p, :k, :c, :h, now())
                RETURNING {_COLS}
                """
            ),
            {
                "id": credential_id or uuid.uuid4(),
                "u": user_id,
                "p": provider,
                "k": key_id,
                "c": ciphertext,
                "h": key_hint,
            },
        )
    ).one()
    return CredentialRow(**row._mapping)


async def list_for_user(session: AsyncSession, user_id: str) -> list[CredentialRow]:
    rows = await session.execute(
        text(
            f"SELECT {_COLS} FROM user_model_credential WHERE user_id = :u ORDER BY created_at DESC"
        ),
        {"u": user_id},
    )
    return [CredentialRow(**r._mapping) for r in rows]


async def get(session: AsyncSession, credential_id: uuid.UUID) -> CredentialRow | None:
    row = (
        await session.execute(
            text(f"SELECT {_COLS} FROM user_model_credential WHERE id = :id"),
            {"id": credential_id},
        )
    ).first()
    return CredentialRow(**row._mapping) if row else None


async def active_for_user(
    session: AsyncSession, user_id: str, provider: str
) -> CredentialRow | None:
    row = (
        await session.execute(
            text(
                f"""
                SELECT {_COLS} FROM user_model_credential
                WHERE user_id = :u AND provider = :p AND revoked_at IS NULL
                ORDER BY created_at DESC LIMIT 1
                """
            ),
            {"u": user_id, "p": provider},
        )
    ).first()
    return CredentialRow(**row._mapping) if row else None


async def revoke(session: AsyncSession, user_id: str, credential_id: uuid.UUID) -> bool:
    result = await session.execute(
        text(
            """
            UPDATE user_model_credential SET revoked_at = now()
            WHERE id = :id AND user_id = :u AND revoked_at IS NULL
            """
        ),
        {"id": credential_id, "u": user_id},
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def all_active(session: AsyncSession) -> list[CredentialRow]:
    rows = await session.execute(
        text(f"SELECT {_COLS} FROM user_model_credential WHERE revoked_at IS NULL FOR UPDATE")
    )
    return [CredentialRow(**r._mapping) for r in rows]


async def replace_ciphertext(
    session: AsyncSession, credential_id: uuid.UUID, key_id: str, ciphertext: bytes
) -> None:
    await session.execute(
        text("UPDATE user_model_credential SET key_id = :k, ciphertext = :c WHERE id = :id"),
        {"k": key_id, "c": ciphertext, "id": credential_id},
    )
