"""What an OpenAI-compatible server's error body says (providers/openai_compat.py reads a failed
call's answer through these): a content filter's refusal, an account out of credit, a request too
long for the model's context window. Pure: no I/O.
"""

from __future__ import annotations

import json
import re


def is_content_filter_error(body: str) -> bool:
    """Whether a 4xx error body says the provider's content filter rejected the request."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            if isinstance(code, str) and code.lower() == "content_filter":
                return True
    lowered = body.lower()
    return "content_filter" in lowered or "content filter" in lowered


# What OpenAI-compatible servers say when the prompt plus max_tokens exceed the model's window
# (OpenAI: "maximum context length", code context_length_exceeded; DeepSeek the same text).
_TOO_LONG = re.compile(
    r"(?i)context[_ ]length|maximum context|too many tokens|too long|token limit"
)


def is_quota_exhausted(body: str) -> bool:
    """Whether a 429's body says the account has no credit left (OpenAI `insufficient_quota`)."""
    return "insufficient_quota" in body.lower()


def is_too_long_error(body: str) -> bool:
    """Whether a 4xx error body says the request is too large for the model."""
    return bool(_TOO_LONG.search(body))
