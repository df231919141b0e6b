"""A batch's files, line by line: the JSONL lines the engine uploads (and the multipart frame
they are streamed in), and the lines of the output and error files it reads back.

An input line is `{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}`; the
body is the chat request EXECUTE would send, never with `stream` (a batch answers whole). Its
bytes are a function of the custom id and the body's content alone (`encode_line`: compact, the
body's keys sorted), so the size counted at enroll, from the body as built, is the size
streamed at upload, from the body as PostgreSQL gives it back (jsonb keeps no key order).

An output line is `{"id", "custom_id", "response": {"status_code", "request_id", "body"},
"error"}`; an error-file line of a request that never ran has `"response": null` and an
`error` (`parse_result_line`).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from providers.base import Usage
from providers.openai_stream import parse_usage
from providers.structured import refuses_form

CHAT_URL = "/v1/chat/completions"
_CODE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
# A line refused for its `response_format` (providers/structured.py `refuses_form`): its job's
# next line asks in the next form down (jobs/batch_job.py); REQUEST_REJECTED when there is none.
FORM_REFUSED = "REQUEST_FORMAT_REFUSED"
_NOT_SENT = ("stream", "stream_options")


def batch_line(custom_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """One JSONL line of a batch: the chat request `body` as EXECUTE would send it, without
    `stream` or `stream_options` (a batch's answer is always whole)."""
    clean = {k: v for k, v in body.items() if k not in _NOT_SENT}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT_URL, "body": clean}


def _dumped(value: Any) -> bytes:
    return json.dumps(
        value, separators=(",", ":"), ensure_ascii=False, sort_keys=True, allow_nan=False
    ).encode()


def encode_line(custom_id: str, body: Mapping[str, Any]) -> bytes:
    """The line's bytes as uploaded, its newline included: `batch_line` with its fields in that
    order and the body's keys sorted, so that the same content always gives the same bytes."""
    clean = {k: v for k, v in body.items() if k not in _NOT_SENT}
    return (
        b'{"custom_id":'
        + _dumped(custom_id)
        + b',"method":"POST","url":'
        + _dumped(CHAT_URL)
        + b',"body":'
        + _dumped(clean)
        + b"}\n"
    )


def jsonl(lines: Iterable[Mapping[str, Any]]) -> bytes:
    """A file of whole lines (tests, small files): one compact JSON object per line."""
    return b"".join(
        json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        for line in lines
    )


@dataclass(frozen=True)
class Multipart:
    """The multipart/form-data frame of one uploaded file (purpose `batch`): what goes before
    its bytes and after them, so a file streamed from the database is sent with an exact
    `Content-Length`. The boundary is random per upload (a prompt cannot aim at it)."""

    content_type: str
    head: bytes
    tail: bytes

    def length(self, file_bytes: int) -> int:
        return len(self.head) + file_bytes + len(self.tail)


def multipart(filename: str, purpose: str = "batch") -> Multipart:
    boundary = f"aijobs-{uuid.uuid4().hex}"
    head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="purpose"\r\n\r\n'
        f"{purpose}\r\n"
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    return Multipart(f"multipart/form-data; boundary={boundary}", head, tail)


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


def error_code_of(body: Any) -> str | None:
    """The provider's short error code of an error body (`error.code`), if it looks like one."""
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) and _CODE.match(code) else None


def result_of(raw: Any) -> LineResult | None:
    """One parsed line of an output or error file; None when it names no request."""
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
        code = code_for_status(status or 500, error_code_of(body))
        return LineResult(custom_id, status, None, usage, code)
    # No response: the request never ran (the batch expired, was cancelled or failed first).
    return LineResult(custom_id, None, None, None, "PROVIDER_UNAVAILABLE")


def parse_result_line(text: str) -> LineResult | None:
    """A line of an output or error file; None for a blank line, one that is not JSON or one
    that names no request (skipped, as the files may end with a newline)."""
    if not text.strip():
        return None
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    return result_of(raw)


def parse_results(*files: bytes) -> dict[str, LineResult]:
    """Each request's outcome by custom_id, from whole files (tests and small files; the batch
    workflow reads its files line by line). An answered line wins over an error line of the
    same request."""
    results: dict[str, LineResult] = {}
    for content in files:
        for text in content.decode("utf-8", errors="replace").splitlines():
            line = parse_result_line(text)
            if line is None:
                continue
            seen = results.get(line.custom_id)
            if seen is None or (line.succeeded and not seen.succeeded):
                results[line.custom_id] = line
    return results
