"""The provider's batch API (OpenAI's Files and Batches endpoints), for the batch tier.

A batch is one JSONL file, one line per job (providers/batch_lines.py). The file is uploaded
(`POST {base}/files`, purpose `batch`: streamed from the database with its `Content-Length`),
a batch is created over it (`POST {base}/batches`, completion window `24h`, the engine's batch
id in its `metadata`), polled (`GET {base}/batches/{id}`) and, once ended, its output and error
files are read line by line (`GET {base}/files/{id}/content`) and deleted (`DELETE
{base}/files/{id}`). `POST {base}/batches/{id}/cancel` stops a batch nobody waits for any more.
A submit whose answer was lost finds what it made by listing: `GET {base}/batches` (paged by
`limit` and `after`, `has_more`) for the batch carrying its id, `GET {base}/files?purpose=batch`
for the file carrying its name.

Secrecy: the key travels only in the Authorization header; an error's `internal_message` carries
the HTTP status and at most the provider's short error code, never a body (a file's content or
an error body may hold prompts). Failures raise `ExecutionFailure` with the engine's provider
codes, built outside any `except` block so no httpx object (whose request holds the key) rides
along. Which providers have a batch API is `has_batch_api`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from engine.errors import ExecutionFailure
from providers.base import Provider
from providers.batch_lines import (
    CHAT_URL,
    FORM_REFUSED,
    LineResult,
    batch_line,
    code_for_status,
    error_code_of,
    jsonl,
    multipart,
    parse_result_line,
    parse_results,
)
from providers.openai_compat import OpenAICompatibleProvider

__all__ = [
    "BATCH_PROVIDERS",
    "CHAT_URL",
    "FORM_REFUSED",
    "BatchClient",
    "LineResult",
    "ProviderBatch",
    "ProviderFile",
    "batch_line",
    "code_for_status",
    "has_batch_api",
    "jsonl",
    "parse_result_line",
    "parse_results",
]

# The providers (providers/factory.py names) whose endpoint has a batch API: the generic
# OpenAI-compatible one. DeepSeek's endpoint has none, nor has the synthetic provider.
BATCH_PROVIDERS: frozenset[str] = frozenset({"openai_compatible"})
COMPLETION_WINDOW = "24h"
# OpenAI's batch states: still running, or ended (no answer will change any more).
RUNNING_STATES = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
ENDED_STATES = frozenset({"completed", "failed", "expired", "cancelled"})
# A batch list page (OpenAI: 1 to 100, default 20), and how many pages a look-up reads at most
# (a provider whose `has_more` never ends cannot hold a submit forever).
LIST_LIMIT = 100
MAX_PAGES = 500
DELETE_TIMEOUT_S = 10.0


def has_batch_api(provider: Provider | str) -> bool:
    """Whether `provider` accepts OpenAI's Files and Batches endpoints: the generic
    OpenAI-compatible provider does; DeepSeek's endpoint (name "deepseek") and the synthetic
    provider do not. A capability of the endpoint, so a create asking for the batch tier is
    refused (jobs/policy.py) rather than run at standard. Given a name (a batch row's
    `provider`), only the generic provider's name has one."""
    if isinstance(provider, str):
        return provider in BATCH_PROVIDERS
    return isinstance(provider, OpenAICompatibleProvider) and provider.name != "deepseek"


@dataclass(frozen=True)
class ProviderBatch:
    """What the provider says of a batch (its `request_counts` as total/completed/failed, its
    `metadata`, its `created_at` in epoch seconds)."""

    id: str
    status: str
    input_file_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)
    created_at: float | None = None

    @property
    def ended(self) -> bool:
        return self.status in ENDED_STATES


@dataclass(frozen=True)
class ProviderFile:
    """A file object (`id`, `filename`, `bytes`, `created_at` in epoch seconds)."""

    id: str
    filename: str | None = None
    bytes: int | None = None
    created_at: float | None = None


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
        metadata=data["metadata"] if isinstance(data.get("metadata"), dict) else {},
        created_at=_time(data),
    )


def _time(data: dict[str, Any]) -> float | None:
    value = data.get("created_at")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _file(data: Any) -> ProviderFile | None:
    if not isinstance(data, dict) or not _text(data, "id"):
        return None
    size = data.get("bytes")
    return ProviderFile(
        str(data["id"]),
        _text(data, "filename"),
        size if isinstance(size, int) else None,
        _time(data),
    )


@dataclass(frozen=True)
class _Page:
    """One page of a list: its objects, and the cursor of the next page (None: the last)."""

    data: list[Any]
    after: str | None


def _page(body: Any, previous: str | None) -> _Page:
    """A list answer (`data`, `has_more`, `last_id`). A page that would not move the cursor
    ends the listing (a provider repeating itself cannot hold a look-up forever)."""
    data = body.get("data") if isinstance(body, dict) else None
    rows = [r for r in data if isinstance(r, dict)] if isinstance(data, list) else []
    last = body.get("last_id") if isinstance(body, dict) else None
    if not isinstance(last, str) or not last:
        last = _text(rows[-1], "id") if rows else None
    more = isinstance(body, dict) and body.get("has_more") is True
    return _Page(rows, last if more and last and last != previous else None)


def _older(rows: list[Any], since: float) -> bool:
    """Every object of a page was created before `since` (and says when): with a newest-first
    list, nothing after this page is newer."""
    times = [_time(r) for r in rows]
    return bool(rows) and all(t is not None and t < since for t in times)


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

    async def _send(
        self, method: str, path: str, *, ok_404: bool = False, **kw: Any
    ) -> httpx.Response:
        """One request; transport problems and error answers become ExecutionFailure (raised
        outside the handler, so no httpx object is chained). `ok_404`: a 404 is an answer."""
        failure: ExecutionFailure
        url = f"{self.base_url}{path}"
        headers = {**self._headers(), **kw.pop("headers", {})}
        timeout = kw.pop("timeout", self._timeout)
        try:
            response = await self._client.request(
                method, url, headers=headers, timeout=timeout, **kw
            )
        except httpx.TimeoutException:
            failure = ExecutionFailure("PROVIDER_TIMEOUT", internal_message="batch API: timeout")
        except (httpx.HTTPError, RuntimeError) as exc:
            failure = _transport_failure(exc)
        else:
            if 200 <= response.status_code < 300 or (ok_404 and response.status_code == 404):
                return response
            failure = self._status_failure(response)
        raise failure

    @staticmethod
    def _status_failure(response: httpx.Response) -> ExecutionFailure:
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        code = error_code_of(body)
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
        """Upload a whole JSONL file (purpose `batch`); its file id."""
        data = await self._json(
            "POST",
            "/files",
            data={"purpose": "batch"},
            files={"file": (filename, content, "application/jsonl")},
        )
        return _file_id(data)

    async def upload_stream(
        self, filename: str, file_bytes: int, chunks: AsyncIterator[bytes]
    ) -> str:
        """Upload a JSONL file of exactly `file_bytes` bytes as it is produced (`chunks`, from
        the database): one multipart body with its `Content-Length`, never whole in memory.
        Its file id."""
        frame = multipart(filename)

        async def body() -> AsyncIterator[bytes]:
            yield frame.head
            async for chunk in chunks:
                yield chunk
            yield frame.tail

        headers = {
            "Content-Type": frame.content_type,
            "Content-Length": str(frame.length(file_bytes)),
        }
        return _file_id(await self._json("POST", "/files", content=body(), headers=headers))

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

    async def find_batch(
        self, key: str, value: str, *, since: float, limit: int = LIST_LIMIT
    ) -> ProviderBatch | None:
        """The batch whose `metadata[key]` is `value`, listed by `GET /batches` (`limit`,
        `after`, `has_more`), or None. The list's order is not relied on to skip anything: it
        is read page by page until the batch is found, the pages end, or a whole page was
        created before `since` (newest first, nothing later is newer)."""
        after: str | None = None
        for _ in range(MAX_PAGES):
            params: dict[str, Any] = {"limit": limit}
            if after is not None:
                params["after"] = after
            page = _page(await self._json("GET", "/batches", params=params), after)
            for raw in page.data:
                meta = raw.get("metadata")
                if isinstance(meta, dict) and meta.get(key) == value:
                    return parse_batch(raw)
            if page.after is None or _older(page.data, since):
                return None
            after = page.after
        return None

    async def find_files(self, filename: str, *, since: float) -> list[ProviderFile]:
        """Every file named `filename` among the batch files (`GET /files?purpose=batch`,
        paged by `after` while `has_more`, until a whole page is older than `since`)."""
        found: list[ProviderFile] = []
        after: str | None = None
        for _ in range(MAX_PAGES):
            params: dict[str, Any] = {"purpose": "batch"}
            if after is not None:
                params["after"] = after
            page = _page(await self._json("GET", "/files", params=params), after)
            found += [f for f in map(_file, page.data) if f is not None and f.filename == filename]
            if page.after is None or _older(page.data, since):
                break
            after = page.after
        return found

    async def delete_file(self, file_id: str) -> None:
        """Delete a file (`DELETE /files/{id}`); one that is gone already (404) is done. A
        short wait: a delete that does not answer is simply tried again later."""
        await self._send("DELETE", f"/files/{file_id}", ok_404=True, timeout=DELETE_TIMEOUT_S)

    async def content(self, file_id: str) -> bytes:
        """A file's whole content (tests and small files)."""
        return (await self._send("GET", f"/files/{file_id}/content")).content

    async def content_lines(self, file_id: str) -> AsyncGenerator[LineResult]:
        """A batch's output or error file, read line by line as it arrives (never whole in
        memory): each line that names a request. A broken read is a failure; what was read
        before it was already yielded (the caller records outcomes once, so a retried read
        skips them)."""
        failure: ExecutionFailure | None = None
        url = f"{self.base_url}/files/{file_id}/content"
        try:
            async with self._client.stream(
                "GET", url, headers=self._headers(), timeout=self._timeout
            ) as response:
                if not 200 <= response.status_code < 300:
                    await response.aread()
                    failure = self._status_failure(response)
                else:
                    async for text in response.aiter_lines():
                        line = parse_result_line(text)
                        if line is not None:
                            yield line
        except httpx.TimeoutException:
            failure = ExecutionFailure("PROVIDER_TIMEOUT", internal_message="batch API: timeout")
        except (httpx.HTTPError, RuntimeError) as exc:
            failure = _transport_failure(exc)
        if failure is not None:
            raise failure


def _transport_failure(exc: BaseException) -> ExecutionFailure:
    return ExecutionFailure(
        "PROVIDER_UNAVAILABLE",
        internal_message=f"batch API: transport error: {type(exc).__name__}",
    )


def _file_id(data: Any) -> str:
    file_id = data.get("id") if isinstance(data, dict) else None
    if not isinstance(file_id, str) or not file_id:
        raise ExecutionFailure(
            "PROVIDER_UNAVAILABLE", internal_message="batch API: upload without a file id"
        )
    return file_id
