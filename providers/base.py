"""The provider protocol every AI backend implements.

Providers raise `engine.errors.ExecutionFailure(code, ...)` with these codes (docs/contracts.md,
errors): CREDENTIAL_INVALID, PROVIDER_RATE_LIMITED (retry_after_s set when the provider said),
PROVIDER_UNAVAILABLE, PROVIDER_TIMEOUT, CONTENT_SAFETY_BLOCKED. Output validation is the caller's
job (it knows the output model). Nothing here logs prompts, outputs or keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class SyntheticBehaviour:
    """Scripted behaviour for the synthetic provider (the `synthetic` job type's input)."""

    output: Mapping[str, Any]
    delay_ms: int = 0
    fail_times: int = 0
    fail_code: str = "PROVIDER_UNAVAILABLE"
    hang: bool = False
    invalid_output: bool = False


@dataclass(frozen=True)
class ProviderRequest:
    job_id: str
    job_type: str
    attempt: int
    model: str
    system_prompt: str
    user_prompt: str
    output_schema: Mapping[str, Any]
    timeout_s: float
    # The decrypted key; exists only inside the EXECUTE activity. Never logged (repr=False).
    api_key: str | None = field(default=None, repr=False)
    # What the synthetic provider answers with; other providers ignore it.
    synthetic: SyntheticBehaviour | None = None
    # The answer's token budget (the job type's max_output_tokens); None: the provider's own.
    max_tokens: int | None = None


@dataclass(frozen=True)
class RateLimitHeaders:
    """What a provider's answer said about its rate limits for the key that made the call
    (OpenAI's `x-ratelimit-*` headers): the per-minute limits, what is left of them, and the
    seconds until each is whole again. Each is None when absent or unreadable."""

    limit_requests: int | None = None
    limit_tokens: int | None = None
    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    reset_requests_s: float | None = None
    reset_tokens_s: float | None = None


@dataclass(frozen=True)
class ProviderResponse:
    content: str  # raw model text (JSON expected); never logged
    tokens_in: int
    tokens_out: int
    provider: str
    model: str
    latency_ms: int
    # The answer's rate-limit headers (None: it sent none); the limiter learns from them.
    rate_limit: RateLimitHeaders | None = None


@runtime_checkable
class Provider(Protocol):
    name: str

    async def generate(self, request: ProviderRequest) -> ProviderResponse: ...
