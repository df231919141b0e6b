"""The provider protocol every AI backend implements.

Providers raise `engine.errors.ExecutionFailure(code, ...)` with these codes (docs/contracts.md,
errors): CREDENTIAL_INVALID, PROVIDER_RATE_LIMITED (retry_after_s set when the provider said),
PROVIDER_UNAVAILABLE, PROVIDER_TIMEOUT, CONTENT_SAFETY_BLOCKED. Output validation is the caller's
job (it knows the output model). Nothing here logs prompts, outputs or keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable


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
class Usage:
    """What the provider said a call used. `cached_input_tokens` are part of `tokens_in` (the
    prompt tokens served from its cache) and `reasoning_tokens` part of `tokens_out`; each part
    is at most its whole."""

    tokens_in: int
    tokens_out: int
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(eq=False)
class CallProgress:
    """What one provider call has done so far, kept up to date by the provider while it runs, so
    that a caller whose call was cut (cancelled, timed out, connection broken, empty answer) can
    still tell what it must pay for. One object per call; the provider only ever moves it
    forward (a flag set stays set, counts only grow).

    - `request_sent`: the request may have reached the provider (its headers started going out,
      or the transport cannot tell and the call did not fail to connect): the provider may bill.
    - `status`: the HTTP status of the answer, once its headers were read.
    - `usage`: the usage the provider reported, once seen (the final chunk of a stream).
    - `chars_received`, `tokens_received_estimate`: how much of the answer was read (the
      content, and the reasoning text a reasoning model streams, which it bills too).
    - `finished`: the answer's body was read to its end (a whole answer or error answer, or a
      stream up to its last chunk).
    """

    request_sent: bool = False
    status: int | None = None
    usage: Usage | None = None
    chars_received: int = 0
    tokens_received_estimate: int = 0
    finished: bool = False


class Charge(NamedTuple):
    """What to charge for a call: token counts and whether the provider reported them
    ("reported") or the engine bounded them ("estimated")."""

    tokens_in: int
    tokens_out: int
    basis: Literal["reported", "estimated"]
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0


def charge_for(
    progress: CallProgress, prompt_tokens_estimate: int, max_output_tokens: int, margin: float
) -> Charge | None:
    """The tokens a call is charged for, whatever way it ended, so that every call the provider
    may bill is charged and never for less than it may have cost (a budget errs on the safe
    side):

    - nothing sent: None, nothing to charge (the provider cannot bill what it never received);
    - usage reported: that usage ("reported");
    - an error answer (not 2xx) read to its end and no usage in it: zero tokens ("reported"):
      the provider said what it was, a refusal it does not bill;
    - part of the answer read: the prompt estimate and the tokens received, each with the
      margin (ceil(n * (1 + margin))), the answer capped at its budget ("estimated");
    - nothing of the answer read: the worst case the reservation was made for, the prompt with
      the margin and the whole answer budget ("estimated").
    """
    if not progress.request_sent:
        return None
    usage = progress.usage
    if usage is not None:
        return Charge(
            usage.tokens_in,
            usage.tokens_out,
            "reported",
            usage.cached_input_tokens,
            usage.reasoning_tokens,
        )
    if progress.finished and progress.status is not None and not 200 <= progress.status < 300:
        return Charge(0, 0, "reported")
    prompt = math.ceil(max(0, prompt_tokens_estimate) * (1 + margin))
    budget = max(0, max_output_tokens)
    received = max(progress.tokens_received_estimate, 0)
    if received > 0 or progress.chars_received > 0:
        out = min(budget, math.ceil(max(received, 1) * (1 + margin)))
        return Charge(prompt, out, "estimated")
    return Charge(prompt, budget, "estimated")


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
    # Ask for a streamed answer (a provider may still answer whole; a model listed in
    # AI_STREAM_DISABLED_MODELS is never asked to stream).
    stream: bool = False
    # Updated by the provider as the call goes (see CallProgress); None: nobody is watching.
    progress: CallProgress | None = field(default=None, repr=False, compare=False)
    # Called with each piece of answer text as it arrives (a stream's content deltas, or the
    # whole content of an answer that was not streamed), in order; their concatenation is the
    # answer's content. Must be cheap and must not raise; never given to a log.
    on_delta: Callable[[str], None] | None = field(default=None, repr=False, compare=False)
    # The service tier and price factor the call is charged at, decided when the request is
    # built, just before it is sent (jobs/offpeak.py `call_tier`); providers ignore them.
    service_tier: str = "standard"
    discount: Decimal | None = None
    # The structured-output form the call asks for (providers/structured.py), the output
    # schema's name and its strict form (sent with `json_schema`).
    structured_output: str = "json_object"
    schema_name: str = "output"
    strict_schema: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)


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
    # Parts of tokens_in served from the provider's cache, and of tokens_out spent reasoning
    # (priced by providers.pricing.PriceTable.call_cost).
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    # False when the provider reported no usage (a stream whose server ignored include_usage,
    # a body without `usage`): the token counts are then 0, and what to charge is
    # `charge_for(progress, ...)`'s estimate.
    usage_reported: bool = True


@runtime_checkable
class Provider(Protocol):
    name: str

    async def generate(self, request: ProviderRequest) -> ProviderResponse: ...
