"""Encryption of users' provider API keys at rest: AES-256-GCM with a rotating keyring.

Setting format: `"kid1:BASE64KEY,kid2:BASE64KEY"`; every key is 32 bytes (standard or urlsafe
base64, padding optional). The FIRST entry is the current key and encrypts everything new; the
others only decrypt, so a rotation is "prepend a new key, re-encrypt lazily, drop the old one".

Invariants:
- the stored blob is `nonce (12 random bytes) || ciphertext+tag`; the key id is stored beside it;
- the AAD (e.g. the owning user/credential id) binds a blob to its row: a blob copied to another
  row does not decrypt;
- no error message ever contains key material or plaintext.
"""

from __future__ import annotations

import base64
import binascii
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engine.errors import ExecutionFailure

# DEVELOPMENT ONLY, and public: anything encrypted with it is effectively plaintext. It lives
# beside the settings so a production process can refuse it at start-up.
from engine.settings import DEV_ENCRYPTION_KEY as DEV_ENCRYPTION_KEY

NONCE_BYTES = 12
KEY_BYTES = 32
_TAG_BYTES = 16


def _decode_key(kid: str, encoded: str) -> bytes:
    text = encoded.strip().replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"encryption key {kid!r} is not valid base64") from None
    if len(key) != KEY_BYTES:
        raise ValueError(f"encryption key {kid!r} must be {KEY_BYTES} bytes, got {len(key)} bytes")
    return key


class CredentialCipher:
    """AES-GCM encryption of credentials under a keyring; see the module docstring."""

    def __init__(self, keys: dict[str, bytes], current_key_id: str) -> None:
        if current_key_id not in keys:
            raise ValueError("current key id is not in the keyring")
        for kid, key in keys.items():
            if len(key) != KEY_BYTES:
                raise ValueError(f"encryption key {kid!r} must be {KEY_BYTES} bytes")
        self._ciphers = {kid: AESGCM(key) for kid, key in keys.items()}
        self._current = current_key_id

    @classmethod
    def from_setting(cls, raw: str) -> CredentialCipher:
        """Parse `"kid1:BASE64KEY,kid2:BASE64KEY"`; the first entry becomes current.

        Raises ValueError naming the offending entry (by key id or position), never the key.
        """
        entries = [entry.strip() for entry in raw.split(",") if entry.strip()]
        if not entries:
            raise ValueError("encryption key setting is empty")
        keys: dict[str, bytes] = {}
        for position, entry in enumerate(entries):
            kid, sep, encoded = entry.partition(":")
            kid = kid.strip()
            if not sep or not kid or not encoded.strip():
                raise ValueError(f"encryption key entry {position} must look like 'kid:BASE64KEY'")
            if kid in keys:
                raise ValueError(f"encryption key id {kid!r} appears more than once")
            keys[kid] = _decode_key(kid, encoded)
        return cls(keys, current_key_id=next(iter(keys)))

    @property
    def current_key_id(self) -> str:
        return self._current

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._ciphers)

    def encrypt(self, plaintext: str, *, aad: str) -> tuple[str, bytes]:
        """Encrypt with the current key; returns (key_id, nonce || ciphertext)."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[self._current].encrypt(nonce, plaintext.encode(), aad.encode())
        return self._current, nonce + sealed

    def decrypt(self, key_id: str, blob: bytes, *, aad: str) -> str:
        """Decrypt a blob; unknown key id, wrong AAD or any tampering -> CREDENTIAL_INVALID."""
        cipher = self._ciphers.get(key_id)
        if cipher is None or len(blob) < NONCE_BYTES + _TAG_BYTES:
            raise self._undecryptable()
        try:
            plain = cipher.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad.encode())
            return plain.decode()
        except (InvalidTag, UnicodeDecodeError):
            raise self._undecryptable() from None

    def needs_rotation(self, key_id: str) -> bool:
        """True when a blob under `key_id` should be re-encrypted with the current key."""
        return key_id != self._current

    def reencrypt(self, key_id: str, blob: bytes, *, aad: str) -> tuple[str, bytes]:
        """Decrypt under `key_id` and encrypt again (fresh nonce) under the current key."""
        return self.encrypt(self.decrypt(key_id, blob, aad=aad), aad=aad)

    @staticmethod
    def _undecryptable() -> ExecutionFailure:
        return ExecutionFailure(
            "CREDENTIAL_INVALID", internal_message="credential could not be decrypted"
        )


def credential_aad(user_id: str, provider: str, credential_id: object | None = None) -> str:
    """Associated data binding a stored key's ciphertext to its row (id), owner and provider: a
    blob copied to another row, even one of the same user, does not decrypt. Without an id it
    is the older owner-and-provider binding, still accepted for decryption (rotate-keys moves
    such rows to the row binding)."""
    if credential_id is None:
        return f"user_model_credential:{user_id}:{provider}"
    return f"user_model_credential:{credential_id}:{user_id}:{provider}"


def decrypt_credential(
    cipher: CredentialCipher,
    *,
    credential_id: object,
    user_id: str,
    provider: str,
    key_id: str,
    blob: bytes,
) -> tuple[str, bool]:
    """Decrypt a stored key; returns (plaintext, bound_to_row). Tries the row binding first,
    then the older owner-and-provider binding."""
    try:
        return cipher.decrypt(
            key_id, blob, aad=credential_aad(user_id, provider, credential_id)
        ), True
    except ExecutionFailure:
        return cipher.decrypt(key_id, blob, aad=credential_aad(user_id, provider)), False


def generate_key_setting(kid: str = "k1") -> str:
    """A fresh single-key setting string `"kid:BASE64KEY"` (urlsafe base64 of 32 random bytes)."""
    if not kid or ":" in kid or "," in kid:
        raise ValueError("key id must be non-empty and contain neither ':' nor ','")
    key = AESGCM.generate_key(bit_length=KEY_BYTES * 8)
    return f"{kid}:{base64.urlsafe_b64encode(key).decode()}"


def mask_key(key: str) -> str:
    """Display form of an API key: only the last 4 characters (and an "sk-" prefix) survive.

    Keys shorter than 8 characters are fully masked, since 4 characters would be half of them.
    """
    if len(key) < 8:
        return "****"
    prefix = "sk-" if key.startswith("sk-") else ""
    return f"{prefix}…{key[-4:]}"
