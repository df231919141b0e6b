"""A client for OpenAI-compatible chat-completion APIs (DeepSeek, OpenAI, local servers).

Secrecy invariants (docs/contracts.md, privacy): the API key and the prompts travel only in the
HTTP request. No log line, exception message or `internal_message` produced here contains them; the
`internal_message` may carry the HTTP status and at most 200 characters of the provider's
error body, scrubbed of anything that looks like the key or an echo of the prompts. Provider
exceptions are replaced outside their `except` blocks so that no httpx object (whose request
holds the headers) rides along in `__cause__`/`__context__` into logs or Temporal failures.

Cancellation: `generate()` never catches `asyncio.CancelledError`, so cancelling the awaiting
task aborts the in-flight HTTP request (httpx closes the connection).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from engine.errors import ExecutionFailure, Fault
from providers.base import ProviderRequest, ProviderResponse, RateLimitHeaders

DEFAULT_BASE_URL = "https://api.deepseek.com"

_SNIPPET_MAX = 200
# Anything shaped like a secret key (OpenAI/DeepSeek "sk-...", bearer tokens) is masked in
# error-body snippets even when it is not *our* key, because it may be a partial echo of it.
_KEYLIKE = re.compile(r"(?i)(sk-[\w*.\-]+|bearer\s+\S+)")
# A window this long shared with a prompt means the body echoes the prompt: withhold the body.
_ECHO_WINDOW = 16
_KEY_WINDOW = 8
_WITHHELD = "[body withheld]"


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


def _shares_window(snippet: str, secret: str, window: int) -> bool:
    """True when `snippet` contains any `window`-long substring of `secret`."""
    if len(secret) < window or len(snippet) < window:
        return False
    return any(snippet[i : i + window] in secret for i in range(len(snippet) - window + 1))


def _safe_snippet(body: str, request: ProviderRequest) -> str:
    """At most 200 chars of a provider error body with the key and prompt echoes removed.

    Whitespace is normalised on both sides before comparing, so an echo of a multi-line prompt
    is still recognised; any recognised echo withholds the whole snippet.
    """
    text = body
    if request.api_key:
        text = text.replace(request.api_key, "[key]")
    text = _KEYLIKE.sub("[key]", text)
    text = " ".join(text.split())[:_SNIPPET_MAX]
    if request.api_key and _shares_window(text, request.api_key, _KEY_WINDOW):
        return _WITHHELD
    for prompt in (request.system_prompt, request.user_prompt):
        normalised = " ".join(prompt.split())
        if len(normalised) >= _KEY_WINDOW and normalised in text:
            return _WITHHELD
        if _shares_window(text, normalised, _ECHO_WINDOW):
            return _WITHHELD
    return text


def _is_content_filter_error(body: str) -> bool:
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


def _is_quota_exhausted(body: str) -> bool:
    """Whether a 429's body says the account has no credit left (OpenAI `insufficient_quota`)."""
    return "insufficient_quota" in body.lower()


def _is_too_long_error(body: str) -> bool:
    """Whether a 4xx error body says the request is too large for the model."""
    return bool(_TOO_LONG.search(body))


def _as_token_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return value


class OpenAICompatibleProvider:
    """`Provider` for any server speaking the OpenAI chat-completions protocol.

    The request always asks for `response_format: json_object` and no streaming; the returned
    content is *not* validated here (the caller knows the job's output model).
    """

    def __init__(
        self,
        base_url: str,
        *,
        name: str = "deepseek",
        timeout_s: float = 60.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._owns_client = client is None
        # Constructing an AsyncClient performs no I/O; connections open on first request.
        self._client = client if client is not None else httpx.AsyncClient()

    @property
    def endpoint(self) -> str:
        return f"{self.base_url}/chat/completions"

    @property
    def http_client(self) -> httpx.AsyncClient:
        """The client requests go through (the process wiring instruments it for tracing)."""
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client if this provider created it (an injected one is the caller's)."""
        if self._owns_client:
            await self._client.aclose()

    async def generate(self, request: ProviderRequest) -> ProviderResponse:
        if request.api_key is None:
            raise ExecutionFailure("CREDENTIAL_MISSING", internal_message="no api key for provider")
        timeout_s = min(request.timeout_s, self.timeout_s)
        payload = {
            "model": request.model,
            "messages": [
                {"role": "system", "content": request.system_prompt},
                {"role": "user", "content": request.user_prompt},
            ],
            "response_format": {"type": "json_object"},
            "stream": False,
        }
        if request.max_tokens is not None:
            payload["max_tokens"] = request.max_tokens
        headers = {"Authorization": f"Bearer {request.api_key}"}
        started = time.monotonic()
        response = await self._post(payload, headers, timeout_s)
        latency_ms = int((time.monotonic() - started) * 1000)
        if not 200 <= response.status_code < 300:
            raise self._status_failure(response, request)
        return self._parse_success(response, request, latency_ms)

    async def _post(
        self, payload: dict[str, Any], headers: dict[str, str], timeout_s: float
    ) -> httpx.Response:
        """POST once; transport problems become ExecutionFailure with no httpx object attached.

        The failure is raised *after* the `except` block so that neither `__cause__` nor
        `__context__` references the httpx exception (whose request carries the key).
        """
        failure: ExecutionFailure
        try:
            # httpx's timeout bounds each phase; asyncio.timeout bounds the whole exchange
            # (a server dribbling bytes would otherwise never trip the read timeout).
            async with asyncio.timeout(timeout_s):
                return await self._client.post(
                    self.endpoint,
                    json=payload,
                    headers=headers,
                    timeout=httpx.Timeout(timeout_s),
                )
        except (httpx.TimeoutException, TimeoutError):
            failure = ExecutionFailure(
                "PROVIDER_TIMEOUT", internal_message=f"no answer within {timeout_s:g}s"
            )
        except httpx.TransportError as exc:
            failure = ExecutionFailure(
                "PROVIDER_UNAVAILABLE", internal_message=f"transport error: {type(exc).__name__}"
            )
        except (httpx.HTTPError, RuntimeError) as exc:
            # RuntimeError: httpx refuses to send on a closed client.
            failure = ExecutionFailure(
                "PROVIDER_UNAVAILABLE", internal_message=f"http error: {type(exc).__name__}"
            )
        raise failure

    def _status_failure(
        self, response: httpx.Response, request: ProviderRequest
    ) -> ExecutionFailure:
        """Whose problem an HTTP error is (engine.errors.Fault): the provider's health (5xx, 408,
        a 429 on this key), the key's (401/403, 402), or this request's (other 4xx). Only the
        first is retried as an outage and counted by the key's breaker."""
        status = response.status_code
        body = response.text
        snippet = _safe_snippet(body, request)
        internal = f"HTTP {status}: {snippet}"
        if status in (401, 403):
            return ExecutionFailure("CREDENTIAL_INVALID", internal_message=internal, answered=True)
        if status == 402:
            return ExecutionFailure(
                "CREDENTIAL_INSUFFICIENT_BALANCE", internal_message=internal, answered=True
            )
        if status == 429 and _is_quota_exhausted(body):
            # OpenAI's "insufficient_quota": the account is out of credit, not asked to slow
            # down. Waiting would not help; it is the key's problem.
            return ExecutionFailure(
                "CREDENTIAL_INSUFFICIENT_BALANCE", internal_message=internal, answered=True
            )
        if status == 429:
            return ExecutionFailure(
                "PROVIDER_RATE_LIMITED",
                internal_message=f"HTTP 429: {snippet}",
                retry_after_s=parse_retry_after(response.headers.get("retry-after")),
                answered=True,
            )
        if status == 408:
            return ExecutionFailure(
                "PROVIDER_TIMEOUT", internal_message=f"HTTP 408: {snippet}", answered=True
            )
        if 400 <= status < 500 and _is_content_filter_error(body):
            return ExecutionFailure(
                "CONTENT_SAFETY_BLOCKED",
                internal_message=f"HTTP {status}: provider content filter",
                answered=True,
            )
        if status == 413 or (400 <= status < 500 and _is_too_long_error(body)):
            return ExecutionFailure(
                "REQUEST_TOO_LARGE",
                internal_message=f"HTTP {status} request too large: {snippet}",
                answered=True,
            )
        if 400 <= status < 500:
            return ExecutionFailure(
                "REQUEST_REJECTED",
                internal_message=f"HTTP {status} request rejected by provider: {snippet}",
                answered=True,
            )
        if status >= 500:
            return ExecutionFailure(
                "PROVIDER_UNAVAILABLE",
                internal_message=f"HTTP {status} server error: {snippet}",
                answered=True,
            )
        # 1xx/3xx where an answer was expected: the endpoint is misconfigured (a redirect to a
        # login page, a proxy). Not this request's fault, and not a healthy provider either.
        return ExecutionFailure(
            "PROVIDER_UNAVAILABLE", internal_message=f"HTTP {status} unexpected status"
        )

    def _parse_success(
        self, response: httpx.Response, request: ProviderRequest, latency_ms: int
    ) -> ProviderResponse:
        # A 2xx that is not a chat completion: retried, but the provider did answer, so it is
        # no outage signal (a proxy's error page must not open the breaker for everyone).
        malformed = ExecutionFailure(
            "PROVIDER_UNAVAILABLE",
            internal_message=f"HTTP {response.status_code}: malformed response",
            fault=Fault.REQUEST,
            answered=True,
        )
        try:
            data = response.json()
        except ValueError:
            data = None  # raised below, outside the handler: no exception context attached
        if not isinstance(data, dict):
            raise malformed
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise malformed
        choice: dict[str, Any] = choices[0]
        if choice.get("finish_reason") == "content_filter":
            raise ExecutionFailure(
                "CONTENT_SAFETY_BLOCKED",
                internal_message="finish_reason content_filter",
                answered=True,
            )
        message = choice.get("message")
        if not isinstance(message, dict):
            raise malformed
        content = message.get("content")
        if not isinstance(content, str):
            raise malformed
        usage = data.get("usage")
        usage_map: dict[str, Any] = usage if isinstance(usage, dict) else {}
        model = data.get("model")
        return ProviderResponse(
            content=content,
            tokens_in=_as_token_count(usage_map.get("prompt_tokens")),
            tokens_out=_as_token_count(usage_map.get("completion_tokens")),
            provider=self.name,
            model=model if isinstance(model, str) and model else request.model,
            latency_ms=latency_ms,
            rate_limit=parse_rate_limit_headers(response.headers),
        )
