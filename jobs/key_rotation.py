"""`aijobs rotate-keys`: every encrypted column, re-encrypted under the keyring's current key.

The columns are not listed here: they are the ones db/models/ marks `info=encrypted(...)`
(`db.key_rotation.encrypted_columns`). This module says, per marked column, how its AAD is
built, which rows still use their secret and whether an undecryptable value is fatal; a marked
column it knows nothing about stops the command before anything is written
(tests/integration/test_key_rotation_webhooks.py also requires every binary column to be
marked or declared not secret).

Per column, rows go in keyset batches, one transaction each, locked `FOR UPDATE` (a concurrent
revoke or API secret rotation waits). A value already under the current key and bound to its
row is left alone, so the command is idempotent and can be re-run after a partial failure. A
value no key of the ring opens is left as it is and counted; for a required column that makes
the command exit 1, for an optional one (a webhook's previous secret, which only adds a second
signature during its grace period) it is skipped. Neither plaintexts nor ciphertexts are logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import MetaData

from db.key_rotation import SealedRow, encrypted_columns, replace_sealed, sealed_batch
from db.models import Base
from db.session import SessionMaker
from engine.errors import ExecutionFailure
from jobs.webhooks import endpoint_aad
from providers.crypto import CredentialCipher, credential_aad

log = logging.getLogger(__name__)
BATCH = 500


@dataclass(frozen=True)
class ColumnRotation:
    """How one encrypted column is rotated."""

    # Columns the AAD is built from (besides the row id).
    context: tuple[str, ...]
    # Rows whose secret is still in use; the others (revoked, deleted) are left alone.
    live: str
    # The AADs to try, in order; the first is the binding a re-encrypted value gets.
    aads: Callable[[SealedRow], list[str]]
    # False: an undecryptable value is skipped and counted, never fatal.
    required: bool = True


def _credential_aads(row: SealedRow) -> list[str]:
    user, provider = row.context["user_id"], row.context["provider"]
    # The row binding, then the older owner-and-provider one (moved to the row binding here).
    return [credential_aad(user, provider, row.id), credential_aad(user, provider)]


def _endpoint_aads(row: SealedRow) -> list[str]:
    return [endpoint_aad(row.id)]


ROTATIONS: dict[str, ColumnRotation] = {
    "user_model_credential.ciphertext": ColumnRotation(
        ("user_id", "provider"), "revoked_at IS NULL", _credential_aads
    ),
    "webhook_endpoint.secret_ciphertext": ColumnRotation((), "deleted_at IS NULL", _endpoint_aads),
    "webhook_endpoint.previous_secret_ciphertext": ColumnRotation(
        (), "deleted_at IS NULL", _endpoint_aads, required=False
    ),
}


@dataclass
class ColumnSummary:
    column: str
    required: bool
    rotated: int = 0
    current: int = 0
    undecryptable: int = 0

    def line(self, key_id: str) -> str:
        skipped = "" if self.required or not self.undecryptable else " (skipped)"
        return (
            f"{self.column}: re-encrypted {self.rotated} under key {key_id}; "
            f"{self.current} already current; {self.undecryptable} not decryptable{skipped}"
        )


@dataclass
class RotationSummary:
    columns: list[ColumnSummary] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """A required secret no key of the ring opens (the command exits 1)."""
        return any(c.required and c.undecryptable for c in self.columns)


def _open(cipher: CredentialCipher, row: SealedRow, aads: list[str]) -> tuple[str, bool] | None:
    """(plaintext, bound with the first AAD) or None when nothing opens it."""
    for i, aad in enumerate(aads):
        try:
            return cipher.decrypt(row.key_id, row.blob, aad=aad), i == 0
        except ExecutionFailure:
            continue
    return None


async def rotate_keys(
    sessionmaker: SessionMaker,
    cipher: CredentialCipher,
    *,
    metadata: MetaData = Base.metadata,
    batch: int = BATCH,
) -> RotationSummary:
    """Re-encrypt every marked column's live values under `cipher`'s current key."""
    columns = encrypted_columns(metadata)
    unknown = [c.name for c in columns if c.name not in ROTATIONS]
    if unknown:
        raise RuntimeError(f"no key rotation is defined for encrypted column(s) {unknown}")
    summary = RotationSummary()
    for col in columns:
        how = ROTATIONS[col.name]
        counts = ColumnSummary(col.name, how.required)
        summary.columns.append(counts)
        after = None
        while True:
            async with sessionmaker.begin() as s:
                found = await sealed_batch(
                    s, col, context=how.context, live=how.live, after=after, limit=batch
                )
                for row in found:
                    aads = how.aads(row)
                    opened = _open(cipher, row, aads)
                    if opened is None:
                        counts.undecryptable += 1
                        log.warning(
                            "encrypted value not decryptable by the keyring",
                            extra={"column": col.name, "row_id": str(row.id), "key_id": row.key_id},
                        )
                        continue
                    plain, bound = opened
                    if bound and not cipher.needs_rotation(row.key_id):
                        counts.current += 1
                        continue
                    key_id, blob = cipher.encrypt(plain, aad=aads[0])
                    del plain
                    await replace_sealed(s, col, row.id, key_id, blob)
                    counts.rotated += 1
            if len(found) < batch:
                break
            after = found[-1].id
    return summary
