"""The provider's batch API (OpenAI's Files and Batches endpoints), for the batch tier.

A batch is one JSONL file, one line per job: `{"custom_id", "method": "POST", "url":
"/v1/chat/completions", "body"}`; the body is the chat request EXECUTE would send, never with
`stream` (a batch answers whole). The file is uploaded (`POST {base}/files`, purpose `batch`),
a batch is created over it (`POST {base}/batches`, completion window `24h`), polled
(`GET {base}/batches/{id}`) and, once ended, its output file (one line per answered request:
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`) and error
file (requests that never got an answer: `{"custom_id", "response": null, "error": {"code",
"message"}}`) are read (`GET {base}/files/{id}/content`). `POST {base}/batches/{id}/cancel`
stops a batch nobody waits for any more.

Secrecy: the key travels only in the Authorization header; an error's `internal_message` carries
the HTTP status and at most the provider's short error code, never a body (a file's content or
an error body may hold prompts). Failures raise `ExecutionFailure` with the engine's provider
codes, built outside any `except` block so no httpx object (whose request holds the key) rides
along. Which providers have a batch API is `has_batch_api`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from engine.errors import ExecutionFailure
from providers.base import Provider, Usage
from providers.openai_compat import OpenAICompatibleProvider
from providers.openai_stream import parse_usage
from providers.structured import refuses_form

# The providers (providers/factory.py names) whose endpoint has a batch API: the generic
# OpenAI-compatible one. DeepSeek's endpoint has none, nor has the synthetic provider.
BATCH_PROVIDERS: frozenset[str] = frozenset({"openai_compatible"})
CHAT_URL = "/v1/chat/completions"
COMPLETION_WINDOW = "24h"
# OpenAI's batch states: still running, or ended (no answer will change any more).
RUNNING_STATES = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
ENDED_STATES = frozenset({"completed", "failed", "expired", "cancelled"})
_CODE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
# A line refused for its `response_format` (providers/structured.py `refuses_form`): its job's
# next line asks in the next form down (jobs/batch_job.py); REQUEST_REJECTED when there is none.
FORM_REFUSED = "REQUEST_FORMAT_REFUSED"


def has_batch_api(provider: Provider | str) -> bool:
    """Whether `provider` accepts OpenAI's Files and Batches endpoints: the generic
    OpenAI-compatible provider does; DeepSeek's endpoint (name "deepseek") and the synthetic
    provider do not. A capability of the endpoint, so a create asking for the batch tier is
    refused (jobs/policy.py) rather than run at standard. Given a name (a batch row's
    `provider`), only the generic provider's name has one."""
    if isinstance(provider, str):
        return provider in BATCH_PROVIDERS
    return isinstance(provider, OpenAICompatibleProvider) and provider.name != "deepseek"


def batch_line(custom_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """One JSONL line of a batch: the chat request `body` as EXECUTE would send it, without
    `stream` or `stream_options` (a batch's answer is always whole)."""
    clean = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT_URL, "body": clean}


def jsonl(lines: Iterable[Mapping[str, Any]]) -> bytes:
    """The file a batch is made of: one compact JSON object per line, each line ended."""
    return b"".join(
        json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        for line in lines
    )


@dataclass(frozen=True)
class ProviderBatch:
    """What the provider says of a batch (its `request_counts` as total/completed/failed)."""

    id: str
    status: str
    input_file_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0

    @property
    def ended(self) -> bool:
        return self.status in ENDED_STATES


@dataclass(frozen=True)
class LineResult:
    """One request's outcome in a batch's output or error file. `body` is the chat completion
    (only when the request was answered 2xx); `usage` what the provider billed for it (None:
    nothing); `error_code` the engine's code of a request that failed."""

    custom_id: str
    status_code: int | None
    body: dict[str, Any] | None = field(default=None, repr=False)
    usage: Usage | None = None
    error_code: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.body is not None and self.error_code is None


def code_for_status(status: int, error_code: str | None = None) -> str:
    """The engine's code of a failed HTTP answer (the batch endpoints' or one line's)."""
    if status in (401, 403):
        return "CREDENTIAL_INVALID"
    if status == 402 or (status == 429 and error_code == "insufficient_quota"):
        return "CREDENTIAL_INSUFFICIENT_BALANCE"
    if status == 429:
        return "PROVIDER_RATE_LIMITED"
    if status == 408:
        return "PROVIDER_TIMEOUT"
    if status == 413 or error_code == "context_length_exceeded":
        return "REQUEST_TOO_LARGE"
    if error_code == "content_filter":
        return "CONTENT_SAFETY_BLOCKED"
    if 400 <= status < 500:
        return "REQUEST_REJECTED"
    return "PROVIDER_UNAVAILABLE"


def _error_code(body: Any) -> str | None:
    """The provider's short error code of an error body (`error.code`), if it looks like one."""
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) and _CODE.match(code) else None


def _line_result(raw: Any) -> LineResult | None:
    """One line of an output or error file; None when it names no request."""
    if not isinstance(raw, dict) or not isinstance(raw.get("custom_id"), str):
        return None
    custom_id: str = raw["custom_id"]
    response = raw.get("response")
    if isinstance(response, dict):
        status = response.get("status_code")
        status = status if isinstance(status, int) else None
        body = response.get("body")
        body = body if isinstance(body, dict) else None
        usage = parse_usage(body.get("usage")) if body is not None else None
        if status is not None and 200 <= status < 300 and body is not None:
            return LineResult(custom_id, status, body, usage)
        if status is not None and refuses_form(status, json.dumps(body)):
            # Refused for its structured-output form: its job asks again in a lower one.
            return LineResult(custom_id, status, None, usage, FORM_REFUSED)
        code = code_for_status(status or 500, _error_code(body))
        return LineResult(custom_id, status, None, usage, code)
    # No response: the request never ran (the batch expired, was cancelled or failed first).
    return LineResult(custom_id, None, None, None, "PROVIDER_UNAVAILABLE")


def parse_results(*files: bytes) -> dict[str, LineResult]:
    """Each request's outcome by custom_id, from a batch's output and error files. A line
    that is not JSON or names no request is skipped; an answered line wins over an error line
    of the same request."""
    results: dict[str, LineResult] = {}
    for content in files:
        for text in content.decode("utf-8", errors="replace").splitlines():
            if not text.strip():
                continue
            try:
                raw = json.loads(text)
            except ValueError:
                continue
            line = _line_result(raw)
            if line is None:
                continue
            seen = results.get(line.custom_id)
            if seen is None or (line.succeeded and not seen.succeeded):
                results[line.custom_id] = line
    return results


def _count(counts: Any, key: str) -> int:
    value = counts.get(key) if isinstance(counts, dict) else None
    return value if isinstance(value, int) and value >= 0 else 0


def _text(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and value else None


def parse_batch(data: Any) -> ProviderBatch:
    """A batch object as the provider returned it; a body that is not one is a failure."""
    if not isinstance(data, dict) or not _text(data, "id") or not _text(data, "status"):
        raise ExecutionFailure(
            "PROVIDER_UNAVAILABLE", internal_message="batch API: malformed batch object"
        )
    counts = data.get("request_counts")
    return ProviderBatch(
        id=str(data["id"]),
        status=str(data["status"]),
        input_file_id=_text(data, "input_file_id"),
        output_file_id=_text(data, "output_file_id"),
        error_file_id=_text(data, "error_file_id"),
        total=_count(counts, "total"),
        completed=_count(counts, "completed"),
        failed=_count(counts, "failed"),
    )


class BatchClient:
    """The batch endpoints under one provider's base URL (`.../v1`), through its HTTP client,
    with one key. Holds no state of its own beyond those; the key is never in its repr."""

    def __init__(
        self,
        base_url: str,
        client: httpx.AsyncClient,
        api_key: str | None,
        *,
        timeout_s: float = 60.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = client
        self._api_key = api_key
        self._timeout = httpx.Timeout(timeout_s)

    def __repr__(self) -> str:
        return f"BatchClient({self.base_url!r})"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    async def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request; transport problems and error answers become ExecutionFailure (raised
        outside the handler, so no httpx object is chained)."""
        failure: ExecutionFailure
        url = f"{self.base_url}{path}"
        try:
            response = await self._client.request(
                method, url, headers=self._headers(), timeout=self._timeout, **kw
            )
        except httpx.TimeoutException:
            failure = ExecutionFailure("PROVIDER_TIMEOUT", internal_message="batch API: timeout")
        except (httpx.HTTPError, RuntimeError) as exc:
            failure = ExecutionFailure(
                "PROVIDER_UNAVAILABLE",
                internal_message=f"batch API: transport error: {type(exc).__name__}",
            )
        else:
            if 200 <= response.status_code < 300:
                return response
            failure = self._status_failure(response)
        raise failure

    @staticmethod
    def _status_failure(response: httpx.Response) -> ExecutionFailure:
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        code = _error_code(body)
        status = response.status_code
        return ExecutionFailure(
            code_for_status(status, code),
            internal_message=f"batch API: HTTP {status}" + (f" ({code})" if code else ""),
            answered=True,
        )

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        response = await self._send(method, path, **kw)
        try:
            return response.json()
        except ValueError:
            return None

    async def upload(self, content: bytes, *, filename: str = "batch.jsonl") -> str:
        """Upload a batch's JSONL file (purpose `batch`); its file id."""
        data = await self._json(
            "POST",
            "/files",
            data={"purpose": "batch"},
            files={"file": (filename, content, "application/jsonl")},
        )
        file_id = data.get("id") if isinstance(data, dict) else None
        if not isinstance(file_id, str) or not file_id:
            raise ExecutionFailure(
                "PROVIDER_UNAVAILABLE", internal_message="batch API: upload without a file id"
            )
        return file_id

    async def create(
        self, input_file_id: str, *, metadata: Mapping[str, str] | None = None
    ) -> ProviderBatch:
        """Create a batch over an uploaded file (chat completions, 24 h window)."""
        body: dict[str, Any] = {
            "input_file_id": input_file_id,
            "endpoint": CHAT_URL,
            "completion_window": COMPLETION_WINDOW,
        }
        if metadata:
            body["metadata"] = dict(metadata)
        return parse_batch(await self._json("POST", "/batches", json=body))

    async def get(self, batch_id: str) -> ProviderBatch:
        return parse_batch(await self._json("GET", f"/batches/{batch_id}"))

    async def cancel(self, batch_id: str) -> ProviderBatch:
        return parse_batch(await self._json("POST", f"/batches/{batch_id}/cancel"))

    async def content(self, file_id: str) -> bytes:
        """A file's content (a batch's output or error file)."""
        return (await self._send("GET", f"/files/{file_id}/content")).content
