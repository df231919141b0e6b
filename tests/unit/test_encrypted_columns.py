"""Every secret at rest is rotated: the encrypted columns are derived from the models' `encrypted`
marker, which `aijobs rotate-keys` iterates over, and every binary column must carry the marker
or be declared not secret, so a future encrypted column cannot be forgotten by the rotation. The
rotation itself on a real database is tests/integration/test_key_rotation_webhooks.py."""

from __future__ import annotations

from sqlalchemy import LargeBinary

from db.key_rotation import encrypted_columns
from db.models import ENCRYPTED, Base
from jobs.key_rotation import ROTATIONS

# Binary columns that hold no secret (none today). Adding a bytea column means marking it
# `info=encrypted(...)` in db/models/jobs.py, or listing it here with the reason it is not secret.
NOT_SECRET: dict[str, str] = {}


def binary_columns() -> set[str]:
    return {
        f"{t.name}.{c.name}"
        for t in Base.metadata.sorted_tables
        for c in t.columns
        if isinstance(c.type, LargeBinary)
    }


def marked_columns() -> set[str]:
    return {
        f"{t.name}.{c.name}"
        for t in Base.metadata.sorted_tables
        for c in t.columns
        if ENCRYPTED in c.info
    }


def test_every_binary_column_is_encrypted_and_rotated_or_declared_not_secret() -> None:
    binary = binary_columns()
    assert binary, "the models have encrypted columns"
    assert binary == marked_columns() | set(NOT_SECRET), (
        "a binary column is neither marked encrypted nor declared not secret"
    )
    assert not marked_columns() & set(NOT_SECRET)
    # What the rotation iterates over is the marker, and it knows how to rotate each of them.
    assert {c.name for c in encrypted_columns(Base.metadata)} == marked_columns()
    assert set(ROTATIONS) == marked_columns()
    assert {
        "user_model_credential.ciphertext",
        "webhook_endpoint.secret_ciphertext",
        "webhook_endpoint.previous_secret_ciphertext",
    } <= marked_columns()
