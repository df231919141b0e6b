"""Redaction of personal data (e-mail addresses, phone numbers) in JSON-like values.

Pure: no I/O, no global state. `REDACTION_VERSION` names the rule set, so stored redacted data
can say which rules produced it; change the version whenever the rules change.

Rules (r1):
- e-mail addresses -> "[email]";
- phone numbers -> "[phone]": 7 or more digits, optionally led by "+", possibly separated by
  spaces, dashes, dots and parentheses;
- never masked: short numbers ("42"), years ("2026", "2025 2026"), ISO dates and date-times
  ("2026-12-02", "2026-12-02T10:30:00Z") and plain decimals ("12345.678"); a digit run glued
  to letters, dots or dashes before it (identifiers, UUID tails, versions) is not a phone.
"""

from __future__ import annotations

import re
from typing import Any

REDACTION_VERSION = "r1"

EMAIL_MASK = "[email]"
PHONE_MASK = "[phone]"

_MIN_PHONE_DIGITS = 7

# Where a date begins; the phone branch never runs across one ("order 12 2026-12-02").
_DATE_START = r"(?<![\w.\-])\d{4}-\d{2}-\d{2}(?!\d)"

# One alternation scanned left to right: at each position an e-mail wins over a date, and a
# date over a phone, so dates are consumed whole and never re-read as phone digits. The phone
# branch repeats a single character class (no nested quantifiers): matching stays polynomial.
_PATTERN = re.compile(
    r"(?P<email>[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,})"
    r"|(?P<date>(?<![\w.\-])\d{4}-\d{2}-\d{2}"
    r"(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+\-]\d{2}:?\d{2})?)?(?!\w))"
    r"|(?P<phone>(?<![\w.\-+])\+?[\d(](?:(?!" + _DATE_START + r")[\d \-.()])*\d(?!\w))"
)
_YEAR = re.compile(r"(?:19|20)\d{2}")
_DECIMAL = re.compile(r"\d+\.\d+")
_GROUP_SPLIT = re.compile(r"[ \-.()+]+")


def _is_phone(candidate: str) -> bool:
    digits = sum(ch.isdigit() for ch in candidate)
    if digits < _MIN_PHONE_DIGITS:
        return False
    if _DECIMAL.fullmatch(candidate):
        return False
    groups = [group for group in _GROUP_SPLIT.split(candidate) if group]
    # A list of years ("2025 2026") is not a phone number.
    return not (len(groups) > 1 and all(_YEAR.fullmatch(group) for group in groups))


def _replace(match: re.Match[str]) -> str:
    if match.group("email") is not None:
        return EMAIL_MASK
    phone = match.group("phone")
    if phone is not None and _is_phone(phone):
        return PHONE_MASK
    return match.group(0)


def redact_text(text: str) -> str:
    """Mask e-mail addresses and phone numbers in one string."""
    return _PATTERN.sub(_replace, text)


def redact(value: Any) -> Any:
    """Return a copy of `value` with every string (recursively) redacted.

    Dicts keep their keys; lists and tuples keep their type and order; any other value
    (numbers, booleans, None...) is returned unchanged. The input is never mutated.
    """
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {key: redact(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact(item) for item in value]
    if isinstance(value, tuple):
        return tuple(redact(item) for item in value)
    return value
