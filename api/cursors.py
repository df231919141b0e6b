"""Page cursors: opaque to clients, base64url (no padding) of the last item's position.

Every list endpoint keysets on its own columns; this module is the one codec. A cursor that does
not decode, lacks its endpoint's prefix or holds a number out of its column's range is a 422
`VALIDATION_FAILED` ("The cursor is invalid."), never a driver error.
"""

from __future__ import annotations

import base64
import binascii

from engine.errors import ValidationFailed

# What a cursor may look like in a query string (the routes declare it as their pattern).
CURSOR_PATTERN = r"^[A-Za-z0-9_-]*$"
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1  # a bigint id: larger ones would be a driver error


def invalid() -> ValidationFailed:
    return ValidationFailed("The cursor is invalid.")


def encode(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode(cursor: str) -> str:
    """The cursor's text; raises the invalid-cursor error when it is not base64url UTF-8."""
    try:
        return base64.urlsafe_b64decode((cursor + "=" * (-len(cursor) % 4)).encode()).decode()
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise invalid() from None


def encode_ints(prefix: str, *values: int) -> str:
    return encode(prefix + ":".join(str(v) for v in values))


def decode_ints(
    cursor: str | None, prefix: str, maxima: tuple[int, ...], *, minimum: int = 0
) -> tuple[int, ...] | None:
    """The integers `encode_ints(prefix, ...)` wrote, each within [minimum, its maximum];
    None for no cursor (the first page)."""
    if not cursor:
        return None
    raw = decode(cursor)
    if not raw.startswith(prefix):
        raise invalid()
    fields = raw.removeprefix(prefix).split(":")
    if len(fields) != len(maxima) or not all(f.isascii() and f.isdigit() for f in fields):
        raise invalid()
    values = tuple(int(f) for f in fields)
    if not all(minimum <= v <= m for v, m in zip(values, maxima, strict=True)):
        raise invalid()
    return values


def decode_id(cursor: str | None, prefix: str) -> int | None:
    """A positive bigint id written by `encode_ints(prefix, id)`; None for the first page."""
    values = decode_ints(cursor, prefix, (INT64_MAX,), minimum=1)
    return values[0] if values else None
