"""PII masking of a job's input: e-mail addresses and phone numbers replaced by placeholders
before a prompt is built, and the placeholders in an answer replaced by the original text.

`mask(data, region)` walks a JSON value (a job's input as stored: objects, lists, strings) and
replaces, in every string, each e-mail address (a pattern) and each phone number
(`phonenumbers.PhoneNumberMatcher`, the matcher Presidio's phone recognizer uses, reading
numbers without a country code in `region`) by `<EMAIL_n>` / `<PHONE_n>`. The same text always
gets the same placeholder within one input, numbered in the order the walk first meets it, so
the same input always masks the same way: every attempt, chunk and process derives the map
again from the stored input, and nothing of it is stored or sent to Temporal.

`Masking.restore(value)` replaces each placeholder in an answer's strings by the original text
exactly as the input wrote it; restored text is never masked again (masking applies to inputs
only). A placeholder the input did not produce is left as it is. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import phonenumbers

_EMAIL = re.compile(
    r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"
)
_PLACEHOLDER = re.compile(r"<(?:EMAIL|PHONE)_\d+>")
_MAX_DEPTH = 64


@dataclass(frozen=True)
class Masking:
    """The placeholders of one input: placeholder -> the original text."""

    originals: Mapping[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.originals)

    def restore(self, value: Any, depth: int = 0) -> Any:
        """`value` (an answer: objects, lists, strings) with every known placeholder replaced
        by its original."""
        if not self.originals or depth > _MAX_DEPTH:
            return value
        if isinstance(value, str):
            return _PLACEHOLDER.sub(lambda m: self.originals.get(m.group(0), m.group(0)), value)
        if isinstance(value, list):
            return [self.restore(v, depth + 1) for v in value]
        if isinstance(value, dict):
            return {k: self.restore(v, depth + 1) for k, v in value.items()}
        return value


NO_MASKING = Masking()


class _Masker:
    def __init__(self, region: str) -> None:
        self.region = region
        self.by_text: dict[tuple[str, str], str] = {}
        self.counts = {"EMAIL": 0, "PHONE": 0}

    def placeholder(self, kind: str, text: str) -> str:
        key = (kind, text)
        if key not in self.by_text:
            self.counts[kind] += 1
            self.by_text[key] = f"<{kind}_{self.counts[kind]}>"
        return self.by_text[key]

    def text(self, s: str) -> str:
        if "@" in s:
            s = _EMAIL.sub(lambda m: self.placeholder("EMAIL", m.group(0)), s)
        if not any(c.isdigit() for c in s):
            return s
        out, last = [], 0
        for match in phonenumbers.PhoneNumberMatcher(s, self.region):
            out.append(s[last : match.start])
            out.append(self.placeholder("PHONE", match.raw_string))
            last = match.end
        out.append(s[last:])
        return "".join(out)

    def walk(self, value: Any, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.walk(v, depth + 1) for v in value]
        if isinstance(value, dict):
            return {k: self.walk(v, depth + 1) for k, v in value.items()}
        return value


def mask(data: Any, region: str = "US") -> tuple[Any, Masking]:
    """`data` with its e-mail addresses and phone numbers replaced, and the map back."""
    masker = _Masker(region)
    masked = masker.walk(data)
    return masked, Masking({p: text for (_, text), p in masker.by_text.items()})


def valid_region(region: str) -> bool:
    """Whether `region` (AI_PII_PHONE_REGION) is a region phonenumbers knows, e.g. US, GB."""
    return region.upper() in phonenumbers.SUPPORTED_REGIONS
