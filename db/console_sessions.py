"""The operator console's sessions (`console_session`): a sign-in's row, its lookup and its end.

Rows are found by the SHA-256 (hex) of the session id (`id_hash`): the id itself lives only in
the browser's cookie. Times are the database's clock, so every API process agrees on when a
session ends. Functions take the caller's session and never commit.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

# At most this many expired rows are deleted by one sign-in: enough to keep up with sign-ins,
# small enough that a sign-in after a long idle stretch stays quick.
PURGE_BATCH = 100

_INSERT = text(
    """
    INSERT INTO console_session (id_hash, user_id, expires_at)
    VALUES (:h, :u, LEAST(now() + make_interval(secs => :ttl), :token_exp))
    RETURNING expires_at, now() AS created_at
    """
)
_FIND = text(
    "SELECT user_id, expires_at FROM console_session WHERE id_hash = :h AND expires_at > now()"
)
_DELETE = text("DELETE FROM console_session WHERE id_hash = :h")
_PURGE = text(
    """
    DELETE FROM console_session WHERE id_hash IN (
        SELECT id_hash FROM console_session WHERE expires_at <= now()
        ORDER BY expires_at LIMIT :n
    )
    """
)


async def insert(
    session: AsyncSession, id_hash: str, user_id: str, *, ttl_s: int, token_exp: datetime
) -> tuple[datetime, datetime]:
    """A new session lasting `ttl_s` but never past `token_exp`: (expires_at, now)."""
    row = (
        await session.execute(
            _INSERT, {"h": id_hash, "u": user_id, "ttl": ttl_s, "token_exp": token_exp}
        )
    ).one()
    return row.expires_at, row.created_at


async def find(session: AsyncSession, id_hash: str) -> tuple[str, datetime] | None:
    """The session's admin and its end, while it has not ended."""
    row = (await session.execute(_FIND, {"h": id_hash})).first()
    return (row.user_id, row.expires_at) if row is not None else None


async def delete(session: AsyncSession, id_hash: str) -> bool:
    result = await session.execute(_DELETE, {"h": id_hash})
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def purge_expired(session: AsyncSession, limit: int = PURGE_BATCH) -> int:
    result = await session.execute(_PURGE, {"n": limit})
    return int(result.rowcount)  # type: ignore[attr-defined]
