"""What the headers of an OpenAI-compatible answer say: when to retry (Retry-After) and the
key's rate limits (`x-ratelimit-*`). A header that does not parse is ignored, never an error:
the call's answer matters more than what it says about limits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from providers.base import RateLimitHeaders


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date).

    Returns None when the header is absent or unparsable; never negative.
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if seconds != seconds or seconds in (float("inf"), float("-inf")):  # NaN / inf
            return None
        return max(0.0, seconds)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    reference = now or datetime.now(UTC)
    return max(0.0, (when - reference).total_seconds())


# A Go-style duration as OpenAI writes its resets ("1s", "6m0s", "20ms", "1h2m3.5s"): one or
# more number+unit parts, nothing else.
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|\u00b5s|ns)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "\u00b5s": 1e-6, "ns": 1e-9}
# A reset further away than a day is not a rate limit's: ignored as garbage.
_MAX_RESET_S = 86_400.0
_MAX_COUNT = 2**31 - 1  # the limiter's columns are 32-bit integers


def parse_duration_s(value: str | None) -> float | None:
    """Seconds from a rate-limit reset header: a Go-style duration ("6m0s", "20ms") or plain
    seconds ("2", "0.5"). None when absent, malformed, negative or absurdly long."""
    if value is None:
        return None
    text = value.strip()
    if not text or len(text) > 32:
        return None
    seconds: float | None = None
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION_PART.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if seconds is None or seconds != seconds or not 0 <= seconds <= _MAX_RESET_S:
        return None
    return seconds


def _count(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or len(text) > 10:
        return None
    n = int(text)
    return n if n <= _MAX_COUNT else None


def parse_rate_limit_headers(headers: Mapping[str, str]) -> RateLimitHeaders | None:
    """OpenAI's `x-ratelimit-*` headers of an answer (names case-insensitive when `headers` is
    httpx's). A header that does not parse is ignored, never an error: the call's answer
    matters more than what it says about limits. None when no usable header was sent."""
    got = RateLimitHeaders(
        limit_requests=_count(headers.get("x-ratelimit-limit-requests")),
        limit_tokens=_count(headers.get("x-ratelimit-limit-tokens")),
        remaining_requests=_count(headers.get("x-ratelimit-remaining-requests")),
        remaining_tokens=_count(headers.get("x-ratelimit-remaining-tokens")),
        reset_requests_s=parse_duration_s(headers.get("x-ratelimit-reset-requests")),
        reset_tokens_s=parse_duration_s(headers.get("x-ratelimit-reset-tokens")),
    )
    return None if got == RateLimitHeaders() else got
