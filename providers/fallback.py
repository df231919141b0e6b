"""The deployment's fallback chain (AI_FALLBACKS): the model endpoints a platform-key call moves
to, in order, when its provider is unhealthy, and which failures count as unhealthy.

An entry is `{"model": str, "baseUrl": str (ending in /v1, like AI_BASE_URL), "apiKey": str}`
and optionally `"provider"` (the name its usage rows, gate and limits carry; default
"deepseek" for a DeepSeek URL, else "openai_compatible") and `"structuredOutput"` (the form
its calls ask for, `json_schema`, `json_object` or `none`; it wins over AI_STRUCTURED_OUTPUT
for that entry, providers/structured.py). Each is called with `Authorization:
Bearer <apiKey>` through its own `OpenAICompatibleProvider`.

Secrecy: an entry's key is a `SecretStr` (repr and str hide it); it leaves this module only
into a `ProviderRequest.api_key`, for the HTTP request. `parse_fallbacks` names a bad entry by
its position and model, never by its key, and refuses a base URL carrying credentials (a URL
may reach a log line or an error). The gate and the limiter know an entry as
`fallback:<position>`: its own breaker, pause and limits, apart from the primary's.

What moves a call down the chain (`falls_back`): health failures only (a 5xx, a transport
error, a timeout). Never a request's own error (400, 413, 422, a content filter, an invalid
answer: another model would be sent the same request), a key's (401, 403, 402), or a 429 (the
key's rate limit: another key would spend someone else's quota).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pydantic import SecretStr

from engine.errors import ExecutionFailure, Fault
from providers.base import Provider
from providers.openai_compat import OpenAICompatibleProvider
from providers.structured import FORMS, Form, is_form

_MAX_MODEL = 128
_MAX_PROVIDER = 64
FALLBACK_KEY_PREFIX = "fallback:"


@dataclass(frozen=True)
class FallbackEntry:
    """One endpoint of the chain: its 1-based position in AI_FALLBACKS, its model, base URL,
    key (hidden) and provider name."""

    position: int
    model: str
    base_url: str
    api_key: SecretStr = field(repr=False, compare=False)
    provider: str = "openai_compatible"
    structured_output: Form | None = None  # its own form (None: the model's configured one)

    @property
    def key_ref(self) -> str:
        """How the gate and the limiter name this entry's key (never the key itself)."""
        return f"{FALLBACK_KEY_PREFIX}{self.position}"


def position_of(key_ref: str) -> int | None:
    """The AI_FALLBACKS position a gate's `key_ref` names; None: not a fallback entry's."""
    if not key_ref.startswith(FALLBACK_KEY_PREFIX):
        return None
    digits = key_ref[len(FALLBACK_KEY_PREFIX) :]
    return int(digits) if digits.isdigit() else None


def falls_back(failure: ExecutionFailure) -> bool:
    """Whether a failed call moves to the next entry: a health failure (5xx, transport error,
    provider timeout), never a 429, a request's or a key's error (module docstring)."""
    return failure.fault is Fault.PROVIDER and failure.code != "PROVIDER_RATE_LIMITED"


def reason_of(failure: ExecutionFailure) -> str:
    """The metric's and history's `reason`: a small fixed set, no message text."""
    if failure.code in ("PROVIDER_TIMEOUT", "TIMEOUT"):
        return "timeout"
    message = failure.internal_message or ""
    if message.startswith("HTTP 5"):
        return "5xx"
    return "unavailable"


def _entry(raw: Any, position: int) -> FallbackEntry:
    where = f"AI_FALLBACKS entry {position}"
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: want an object with model, baseUrl, apiKey")
    model = raw.get("model")
    if not isinstance(model, str) or not model.strip() or len(model) > _MAX_MODEL:
        raise ValueError(f"{where}: model must be a string of 1-{_MAX_MODEL} characters")
    where = f"{where} (model {model.strip()[:40]!r})"
    base_url = raw.get("baseUrl")
    if not isinstance(base_url, str):
        raise ValueError(f"{where}: baseUrl must be a string ending in /v1")
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{where}: baseUrl must be an http(s) URL ending in /v1")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError(f"{where}: baseUrl must not carry credentials, a query or a fragment")
    if not parts.path.rstrip("/").endswith("/v1"):
        raise ValueError(f"{where}: baseUrl must end in /v1")
    key = raw.get("apiKey")
    if not isinstance(key, str) or not key.strip():
        raise ValueError(f"{where}: apiKey must be a non-empty string")
    url = base_url.strip().rstrip("/")
    default_name = "deepseek" if "deepseek" in (parts.hostname or "") else "openai_compatible"
    name = raw.get("provider", default_name)
    if not isinstance(name, str) or not name.strip() or len(name) > _MAX_PROVIDER:
        raise ValueError(f"{where}: provider must be a string of 1-{_MAX_PROVIDER} characters")
    form = raw.get("structuredOutput")
    if form is not None and not is_form(form):
        raise ValueError(f"{where}: structuredOutput must be one of {', '.join(FORMS)}")
    return FallbackEntry(position, model.strip(), url, SecretStr(key.strip()), name.strip(), form)


def parse_fallbacks(text: str | SecretStr | None) -> tuple[FallbackEntry, ...]:
    """AI_FALLBACKS parsed (empty or unset: no chain). Raises ValueError naming the setting and
    the entry (its position and model), never a key."""
    raw_text = text.get_secret_value() if isinstance(text, SecretStr) else (text or "")
    if not raw_text.strip():
        return ()
    try:
        raw = json.loads(raw_text)
    except ValueError:
        raise ValueError("AI_FALLBACKS: not valid JSON") from None
    if not isinstance(raw, list):
        raise ValueError("AI_FALLBACKS: want a JSON list of {model, baseUrl, apiKey}")
    entries = tuple(_entry(item, i + 1) for i, item in enumerate(raw))
    models = [e.model.lower() for e in entries]
    if len(set(models)) != len(models):
        raise ValueError(
            "AI_FALLBACKS: each model may appear once (a job type names entries by it)"
        )
    return entries


def fallback_models(text: str | SecretStr | None) -> tuple[str, ...]:
    """The chain's models in order (what the create side prices a job's worst case over)."""
    return tuple(e.model for e in parse_fallbacks(text))


def select(models: Sequence[str], choice: str | tuple[str, ...]) -> tuple[int, ...]:
    """The indexes into `models` (AI_FALLBACKS' models, in order) a job type's `fallback`
    choice keeps: "default" all, "none" none, a tuple of model names those, in its order
    (a name no entry has is skipped)."""
    if choice == "none":
        return ()
    if isinstance(choice, str):
        return tuple(range(len(models)))
    lowered = [m.lower() for m in models]
    return tuple(lowered.index(n.lower()) for n in choice if n.lower() in lowered)


class Fallbacks:
    """The chain's entries and one provider per entry (built once per process, no I/O)."""

    def __init__(self, entries: tuple[FallbackEntry, ...] = (), *, timeout_s: float = 600.0):
        self.entries = entries
        self.providers: dict[int, Provider] = {
            e.position: OpenAICompatibleProvider(e.base_url, name=e.provider, timeout_s=timeout_s)
            for e in entries
        }

    def entry(self, position: int) -> FallbackEntry | None:
        return next((e for e in self.entries if e.position == position), None)

    async def aclose(self) -> None:
        for p in self.providers.values():
            close = getattr(p, "aclose", None)
            if close is not None:
                await close()
