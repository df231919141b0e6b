"""The declarative base every table model shares: naming convention, timestamp type and the
marker of encrypted columns."""

from __future__ import annotations

from typing import Any

from sqlalchemy import DateTime, MetaData
from sqlalchemy.orm import DeclarativeBase

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


TS = DateTime(timezone=True)

# The column `info` key that marks a column holding ciphertext under CREDENTIAL_ENCRYPTION_KEY.
# `aijobs rotate-keys` re-encrypts every column so marked (it refuses to run if one has no
# rotation), and a test requires every binary column to be marked or declared not secret.
ENCRYPTED = "encrypted"


def encrypted(*, key_id: str) -> dict[str, Any]:
    """`info` of an encrypted column; `key_id` names the column holding its key id."""
    return {ENCRYPTED: {"key_id": key_id}}
