"""A client for OpenAI-compatible chat-completion APIs (DeepSeek, OpenAI, local servers).

Secrecy invariants (docs/contracts.md, privacy): the API key and the prompts travel only in the
HTTP request. No log line, exception message or `internal_message` produced here contains them; the
`internal_message` may carry the HTTP status and at most 200 characters of the provider's
error body, scrubbed of anything that looks like the key or an echo of the prompts. Provider
exceptions are replaced outside their `except` blocks so that no httpx object (whose request
holds the headers) rides along in `__cause__`/`__context__` into logs or Temporal failures.

Cancellation: `generate()` never catches `asyncio.CancelledError`, so cancelling the awaiting
task aborts the in-flight HTTP request (httpx closes the connection), a stream included: reading
stops and the connection is closed.

Streaming: a request with `stream=True` asks for a streamed answer with the usage in its last
chunk (`stream_options.include_usage`), unless its model is one the provider was told does not
stream (`stream_disabled_models`, from AI_STREAM_DISABLED_MODELS). Whatever was asked, the answer
is read by its content type: an event stream chunk by chunk, anything else as one JSON answer
(many OpenAI-compatible mocks and proxies ignore `stream`). Error answers are read whole, as
before. The request's `CallProgress` (if any) is kept up to date all along.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from engine.errors import ExecutionFailure
from providers.base import CallProgress, ProviderRequest, ProviderResponse
from providers.openai_errors import is_content_filter_error as _is_content_filter_error
from providers.openai_errors import is_quota_exhausted as _is_quota_exhausted
from providers.openai_errors import is_too_long_error as _is_too_long_error
from providers.openai_headers import parse_duration_s, parse_rate_limit_headers, parse_retry_after
from providers.openai_stream import (
    content_filtered,
    malformed,
    parse_usage,
    read_stream,
)
from providers.structured import FormRefused, refuses_form, response_format

# The header parsers moved to providers/openai_headers.py; importers of this module keep them.
__all__ = [
    "DEFAULT_BASE_URL",
    "OpenAICompatibleProvider",
    "chat_answer",
    "chat_body",
    "parse_duration_s",
    "parse_model_set",
    "parse_rate_limit_headers",
    "parse_retry_after",
]

DEFAULT_BASE_URL = "https://api.deepseek.com"
_CHARS_PER_TOKEN = 4  # the answer's size in tokens when the provider did not say

_SNIPPET_MAX = 200
# Anything shaped like a secret key (OpenAI/DeepSeek "sk-...", bearer tokens) is masked in
# error-body snippets even when it is not *our* key, because it may be a partial echo of it.
_KEYLIKE = re.compile(r"(?i)(sk-[\w*.\-]+|bearer\s+\S+)")
# A window this long shared with a prompt means the body echoes the prompt: withhold the body.
_ECHO_WINDOW = 16
_KEY_WINDOW = 8
_WITHHELD = "[body withheld]"


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


def chat_body(request: ProviderRequest, *, stream: bool | None) -> dict[str, Any]:
    """The chat-completions body of `request` (model, prompts, the `response_format` of its
    structured-output form, answer budget): one builder, so a Batch API line is exactly what a
    call sends. `stream` None leaves `stream` out, as a batch line must; True also asks for
    the usage."""
    payload: dict[str, Any] = {
        "model": request.model,
        "messages": [
            {"role": "system", "content": request.system_prompt},
            {"role": "user", "content": request.user_prompt},
        ],
    }
    fmt = response_format(request.structured_output, request.schema_name, request.strict_schema)
    if fmt is not None:
        payload["response_format"] = fmt
    if stream is not None:
        payload["stream"] = stream
    if stream:
        payload["stream_options"] = {"include_usage": True}
    if request.max_tokens is not None:
        payload["max_tokens"] = request.max_tokens
    return payload


def chat_answer(data: Any, status: int = 200) -> str:
    """The answer text of a chat completion's JSON body (a call's, or a batch output line's);
    raises `malformed` without one, `CONTENT_SAFETY_BLOCKED` when the filter stopped it."""
    bad = malformed(status)
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise bad
    choice: dict[str, Any] = choices[0]
    if choice.get("finish_reason") == "content_filter":
        raise content_filtered()
    message = choice.get("message")
    if not isinstance(message, dict):
        raise bad
    content = message.get("content")
    if not isinstance(content, str):
        raise bad
    return content


class _SendTracer:
    """httpcore's `trace` extension: marks the call's request as sent once its headers start
    going out. `observed` says whether the transport traces at all (a mock transport does
    not); when it does not, a call that did not end normally counts as sent."""

    def __init__(self, progress: CallProgress) -> None:
        self.progress = progress
        self.observed = False

    async def __call__(self, name: str, info: Mapping[str, Any]) -> None:
        self.observed = True
        if name.endswith("send_request_headers.started"):
            self.progress.request_sent = True


def parse_model_set(text: str) -> frozenset[str]:
    """A comma-separated list of model names (AI_STREAM_DISABLED_MODELS), lower-cased; `*`
    stands for every model."""
    return frozenset(name.strip().lower() for name in text.split(",") if name.strip())


class OpenAICompatibleProvider:
    """`Provider` for any server speaking the OpenAI chat-completions protocol.

    The request asks for its structured-output form (`ProviderRequest.structured_output`),
    and streams when the request asks to and its model streams (module docstring); the
    returned content is *not* validated here (the caller knows the job's output model).
    """

    def __init__(
        self,
        base_url: str,
        *,
        name: str = "deepseek",
        timeout_s: float = 60.0,
        client: httpx.AsyncClient | None = None,
        stream_disabled_models: Iterable[str] = (),
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.stream_disabled_models = frozenset(m.strip().lower() for m in stream_disabled_models)
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

    def streams(self, model: str) -> bool:
        """Whether a request for `model` may ask for a streamed answer."""
        disabled = self.stream_disabled_models
        return "*" not in disabled and model.strip().lower() not in disabled

    async def aclose(self) -> None:
        """Close the HTTP client if this provider created it (an injected one is the caller's)."""
        if self._owns_client:
            await self._client.aclose()

    async def generate(self, request: ProviderRequest) -> ProviderResponse:
        if request.api_key is None:
            raise ExecutionFailure("CREDENTIAL_MISSING", internal_message="no api key for provider")
        timeout_s = min(request.timeout_s, self.timeout_s)
        stream = request.stream and self.streams(request.model)
        payload = chat_body(request, stream=stream)
        headers = {"Authorization": f"Bearer {request.api_key}"}
        progress = request.progress if request.progress is not None else CallProgress()
        return await self._exchange(payload, headers, timeout_s, request, progress)

    async def _exchange(
        self,
        payload: dict[str, Any],
        headers: dict[str, str],
        timeout_s: float,
        request: ProviderRequest,
        progress: CallProgress,
    ) -> ProviderResponse:
        """POST once and read the answer; transport problems become ExecutionFailure with no
        httpx object attached.

        The failure is raised *after* the `except` block so that neither `__cause__` nor
        `__context__` references the httpx exception (whose request carries the key).
        """
        failure: ExecutionFailure
        tracer = _SendTracer(progress)
        started = time.monotonic()
        unsent = False
        try:
            # httpx's timeout bounds each phase; asyncio.timeout bounds the whole exchange
            # (a server dribbling bytes would otherwise never trip the read timeout).
            async with (
                asyncio.timeout(timeout_s),
                self._client.stream(
                    "POST",
                    self.endpoint,
                    json=payload,
                    headers=headers,
                    timeout=httpx.Timeout(timeout_s),
                    extensions={"trace": tracer},
                ) as response,
            ):
                progress.request_sent = True
                progress.status = response.status_code
                return await self._read(response, request, progress, started)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            # Never connected: nothing reached the provider.
            unsent = not progress.request_sent
            failure = self._transport_failure(exc, timeout_s)
        except (httpx.TimeoutException, TimeoutError):
            failure = ExecutionFailure(
                "PROVIDER_TIMEOUT", internal_message=f"no answer within {timeout_s:g}s"
            )
        except httpx.TransportError as exc:
            failure = self._transport_failure(exc, timeout_s)
        except (httpx.HTTPError, RuntimeError) as exc:
            # RuntimeError: httpx refuses to send on a closed client.
            unsent = not progress.request_sent
            failure = ExecutionFailure(
                "PROVIDER_UNAVAILABLE", internal_message=f"http error: {type(exc).__name__}"
            )
        finally:
            if not tracer.observed and not unsent:
                # The transport cannot say whether the request went out: count it as sent,
                # so that a cut call is charged rather than lost.
                progress.request_sent = True
        raise failure

    @staticmethod
    def _transport_failure(exc: Exception, timeout_s: float) -> ExecutionFailure:
        if isinstance(exc, httpx.TimeoutException):
            return ExecutionFailure(
                "PROVIDER_TIMEOUT", internal_message=f"no answer within {timeout_s:g}s"
            )
        return ExecutionFailure(
            "PROVIDER_UNAVAILABLE", internal_message=f"transport error: {type(exc).__name__}"
        )

    async def _read(
        self,
        response: httpx.Response,
        request: ProviderRequest,
        progress: CallProgress,
        started: float,
    ) -> ProviderResponse:
        """The answer of a call whose response headers arrived: an error read whole, an event
        stream read chunk by chunk, anything else read whole as one JSON answer."""
        status = response.status_code
        if not 200 <= status < 300:
            await response.aread()
            progress.finished = True
            raise self._status_failure(response, request)
        content_type = response.headers.get("content-type", "").lower()
        if content_type.startswith("text/event-stream"):
            answer = await read_stream(
                response.aiter_lines(), progress, request.on_delta, status=status
            )
            return ProviderResponse(
                content=answer.content,
                tokens_in=answer.usage.tokens_in if answer.usage else 0,
                tokens_out=answer.usage.tokens_out if answer.usage else 0,
                provider=self.name,
                model=answer.model or request.model,
                latency_ms=int((time.monotonic() - started) * 1000),
                rate_limit=parse_rate_limit_headers(response.headers),
                cached_input_tokens=answer.usage.cached_input_tokens if answer.usage else 0,
                reasoning_tokens=answer.usage.reasoning_tokens if answer.usage else 0,
                usage_reported=answer.usage is not None,
            )
        await response.aread()
        progress.finished = True
        latency_ms = int((time.monotonic() - started) * 1000)
        return self._parse_success(response, request, latency_ms, progress)

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
        if refuses_form(status, body):
            # The form this server takes is lower: EXECUTE asks again at once in the next one.
            return FormRefused(
                request.structured_output, f"HTTP {status} response_format refused: {snippet}"
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
        self,
        response: httpx.Response,
        request: ProviderRequest,
        latency_ms: int,
        progress: CallProgress,
    ) -> ProviderResponse:
        bad = malformed(response.status_code)
        try:
            data = response.json()
        except ValueError:
            data = None  # raised below, outside the handler: no exception context attached
        if not isinstance(data, dict):
            raise bad
        usage = parse_usage(data.get("usage"))
        if usage is not None:
            progress.usage = usage
        content = chat_answer(data, response.status_code)
        progress.chars_received += len(content)
        progress.tokens_received_estimate = max(
            progress.tokens_received_estimate, -(-len(content) // _CHARS_PER_TOKEN)
        )
        if content and request.on_delta is not None:
            request.on_delta(content)
        model = data.get("model")
        return ProviderResponse(
            content=content,
            tokens_in=usage.tokens_in if usage else 0,
            tokens_out=usage.tokens_out if usage else 0,
            provider=self.name,
            model=model if isinstance(model, str) and model else request.model,
            latency_ms=latency_ms,
            rate_limit=parse_rate_limit_headers(response.headers),
            cached_input_tokens=usage.cached_input_tokens if usage else 0,
            reasoning_tokens=usage.reasoning_tokens if usage else 0,
            usage_reported=usage is not None,
        )
