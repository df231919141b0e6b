"""The SQL of `aijobs rotate-keys`: the encrypted columns the models mark, read and rewritten a
keyset batch at a time. Table and column names come from the models' metadata, never from
input; every value is a bound parameter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import MetaData, Table, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from db.models import ENCRYPTED


@dataclass(frozen=True)
class EncryptedColumn:
    """A column marked `info=encrypted(key_id=...)` in db/models/jobs.py."""

    table: Table
    column: str
    key_id_column: str

    @property
    def name(self) -> str:
        return f"{self.table.name}.{self.column}"


def encrypted_columns(metadata: MetaData) -> list[EncryptedColumn]:
    """Every marked column of the metadata, in a stable order."""
    found: list[EncryptedColumn] = []
    for table in metadata.sorted_tables:
        for column in table.columns:
            marker = column.info.get(ENCRYPTED)
            if marker is not None:
                found.append(EncryptedColumn(table, column.name, str(marker["key_id"])))
    return found


@dataclass(frozen=True)
class SealedRow:
    id: Any
    key_id: str
    blob: bytes
    context: dict[str, Any]


async def sealed_batch(
    session: AsyncSession,
    col: EncryptedColumn,
    *,
    context: Sequence[str],
    live: str,
    after: Any | None,
    limit: int,
) -> list[SealedRow]:
    """The next `limit` rows (by id, after `after`) whose column holds a value and that satisfy
    `live` (a constant predicate of the rotation's own, e.g. `revoked_at IS NULL`), locked
    `FOR UPDATE` until the caller's transaction ends, so a concurrent write of the same secret
    (a revoke, an API rotation) waits instead of being overwritten."""
    t = col.table
    stmt = (
        select(
            t.c.id,
            t.c[col.key_id_column].label("key_id"),
            t.c[col.column].label("blob"),
            *(t.c[name] for name in context),
        )
        .where(t.c[col.column].is_not(None), text(live))
        .order_by(t.c.id)
        .limit(limit)
        .with_for_update()
    )
    if after is not None:
        stmt = stmt.where(t.c.id > after)
    result = await session.execute(stmt)
    return [
        SealedRow(r.id, str(r.key_id), bytes(r.blob), {name: r._mapping[name] for name in context})
        for r in result
    ]


async def replace_sealed(
    session: AsyncSession, col: EncryptedColumn, row_id: Any, key_id: str, blob: bytes
) -> None:
    t = col.table
    await session.execute(
        update(t).where(t.c.id == row_id).values({col.key_id_column: key_id, col.column: blob})
    )
