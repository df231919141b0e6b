"""The fake OpenAI server's Files and Batches endpoints (tests/fakes/openai_server.py mounts
them under the same base paths as chat/completions: `/v1/...` and `/...`).

- `POST /files` (multipart, `purpose`=`batch`, `file`): stores the file, answers a file object.
- `POST /batches` (`input_file_id`, `endpoint`, `completion_window`): a batch over the file.
  Unless held, its lines are answered at once and the batch is `completed`: each JSONL line is
  answered from the chat script exactly as a chat call with that body would be (queued steps,
  rules, `valid`/`status`/... kinds; a `slow` step answers without waiting), but it is not
  counted as a chat call (`GET /_calls` counts chat calls only). A 2xx answer is a line of
  the output file, any other a line of the error file, both
  `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}`.
- `GET /batches/{id}`, `POST /batches/{id}/cancel`, `GET /files/{id}/content`.

Control (`POST /_batch_script`, replaced whole each time):
- `hold: true`: a new batch stays `in_progress` until `POST /_release` (which also releases
  held streams) or its cancel; a cancelled held batch answers no line (each is an error-file
  line `{"custom_id", "response": null, "error": {"code": "batch_cancelled"}}`).
- `end_status`: `"expired"` (only the first `answer_lines` lines are answered, the rest are
  `batch_expired` error lines) or `"failed"` (no line answered, no file).
- `upload_status` / `create_status`: answer `POST /files` / `POST /batches` with that HTTP
  status (an OpenAI error body) instead, `fail_times` times (default: always).

`GET /_batches` reports every batch (`id`, `status`, `lines`: how many requests its file had,
`requests`: the parsed lines, fake data only), the uploads and cancels seen, and the
`Authorization` headers of the batch calls.
"""

from __future__ import annotations

import email
import email.policy
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

AnswerLine = Callable[[str | None, dict[str, Any]], tuple[int, Any]]


@dataclass
class _Batch:
    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    requests: list[Any]
    status: str = "in_progress"
    output_file_id: str | None = None
    error_file_id: str | None = None
    authorization: str | None = field(default=None, repr=False)
    completed: int = 0
    failed: int = 0
    created_at: int = field(default_factory=lambda: int(time.time()))

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "request_counts": {
                "total": len(self.requests),
                "completed": self.completed,
                "failed": self.failed,
            },
        }


class BatchState:
    """Files, batches and the batch script of one fake app (its event loop only)."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, _Batch] = {}
        self.script: dict[str, Any] = {}
        self.uploads = 0
        self.cancels: list[str] = []
        self.authorizations: list[str | None] = []
        self.failures = 0
        # Lets every held batch run (`POST /_release`); set by `install_batch_routes`.
        self.release: Callable[[], None] = lambda: None

    def reset(self) -> None:
        release = self.release
        self.__init__()  # type: ignore[misc]
        self.release = release

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-fake-{next(self.ids)}"


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": code}}, status_code=status)


def _multipart(content_type: str, body: bytes) -> dict[str, bytes]:
    """The fields of a multipart/form-data body, by name (the stdlib's MIME parser)."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.message_from_bytes(head + body, policy=email.policy.HTTP)
    fields: dict[str, bytes] = {}
    for part in message.iter_parts() if message.is_multipart() else ():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            fields[name] = payload
    return fields


def _parse_lines(content: bytes) -> list[Any] | None:
    lines = []
    for text in content.decode().splitlines():
        if text.strip():
            try:
                lines.append(json.loads(text))
            except ValueError:
                return None
    return lines


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def install_batch_routes(app: FastAPI, answer_line: AnswerLine) -> BatchState:
    """Mount the Files and Batches endpoints and their controls on `app`."""
    state = BatchState()

    def scripted_failure(key: str) -> JSONResponse | None:
        status = state.script.get(key)
        times = state.script.get("fail_times")
        if status is None or (times is not None and state.failures >= int(times)):
            return None
        state.failures += 1
        return _error(int(status), "scripted batch failure", "server_error")

    def run(batch: _Batch, authorization: str | None, *, answer: int | None) -> None:
        """Answer the batch's first `answer` lines (all when None); the rest did not run."""
        outputs: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        reason = "batch_cancelled" if batch.status == "cancelling" else "batch_expired"
        for n, line in enumerate(batch.requests):
            custom_id = line.get("custom_id") if isinstance(line, dict) else None
            body = line.get("body") if isinstance(line, dict) else None
            if (answer is not None and n >= answer) or not isinstance(body, dict):
                errors.append(
                    {
                        "id": state.new_id("batch_req"),
                        "custom_id": custom_id,
                        "response": None,
                        "error": {"code": reason, "message": "This request did not run."},
                    }
                )
                batch.failed += 1
                continue
            status, answer_body = answer_line(authorization, body)
            out = {
                "id": state.new_id("batch_req"),
                "custom_id": custom_id,
                "response": {
                    "status_code": status,
                    "request_id": state.new_id("req"),
                    "body": answer_body,
                },
                "error": None,
            }
            if 200 <= status < 300:
                outputs.append(out)
                batch.completed += 1
            else:
                errors.append(out)
                batch.failed += 1
        if outputs:
            batch.output_file_id = state.new_id("file")
            state.files[batch.output_file_id] = _jsonl(outputs)
        if errors:
            batch.error_file_id = state.new_id("file")
            state.files[batch.error_file_id] = _jsonl(errors)

    def finish(batch: _Batch, authorization: str | None) -> None:
        end = str(state.script.get("end_status", "completed"))
        if end == "failed":
            batch.status = "failed"
            return
        if end == "expired":
            run(batch, authorization, answer=int(state.script.get("answer_lines", 0)))
            batch.status = "expired"
            return
        run(batch, authorization, answer=None)
        batch.status = "completed"

    async def upload(request: Request) -> Response:
        state.authorizations.append(request.headers.get("authorization"))
        failed = scripted_failure("upload_status")
        if failed is not None:
            return failed
        fields = _multipart(request.headers.get("content-type", ""), await request.body())
        if fields.get("purpose") != b"batch" or "file" not in fields:
            return _error(400, "purpose batch and a file are required", "invalid_request")
        file_id = state.new_id("file")
        state.files[file_id] = fields["file"]
        state.uploads += 1
        return JSONResponse(
            {"id": file_id, "object": "file", "bytes": len(fields["file"]), "purpose": "batch"}
        )

    async def create(request: Request) -> Response:
        authorization = request.headers.get("authorization")
        state.authorizations.append(authorization)
        failed = scripted_failure("create_status")
        if failed is not None:
            return failed
        body = json.loads(await request.body())
        content = state.files.get(str(body.get("input_file_id")))
        lines = None if content is None else _parse_lines(content)
        if lines is None:
            return _error(400, "input file missing or not JSONL", "invalid_request")
        batch = _Batch(
            id=state.new_id("batch"),
            input_file_id=str(body["input_file_id"]),
            endpoint=str(body.get("endpoint")),
            completion_window=str(body.get("completion_window")),
            requests=lines,
            authorization=authorization,
        )
        state.batches[batch.id] = batch
        if not state.script.get("hold"):
            finish(batch, authorization)
        return JSONResponse(batch.as_json())

    async def get(batch_id: str, request: Request) -> Response:
        state.authorizations.append(request.headers.get("authorization"))
        batch = state.batches.get(batch_id)
        if batch is None:
            return _error(404, "no such batch", "not_found")
        return JSONResponse(batch.as_json())

    async def cancel(batch_id: str, request: Request) -> Response:
        authorization = request.headers.get("authorization")
        state.authorizations.append(authorization)
        batch = state.batches.get(batch_id)
        if batch is None:
            return _error(404, "no such batch", "not_found")
        state.cancels.append(batch_id)
        if batch.status == "in_progress":
            batch.status = "cancelling"
            run(batch, authorization, answer=0)
            batch.status = "cancelled"
        return JSONResponse(batch.as_json())

    async def content(file_id: str, request: Request) -> Response:
        state.authorizations.append(request.headers.get("authorization"))
        data = state.files.get(file_id)
        if data is None:
            return _error(404, "no such file", "not_found")
        return Response(data, media_type="application/octet-stream")

    for base in ("/v1", ""):
        app.add_api_route(f"{base}/files", upload, methods=["POST"])
        app.add_api_route(f"{base}/files/{{file_id}}/content", content, methods=["GET"])
        app.add_api_route(f"{base}/batches", create, methods=["POST"])
        app.add_api_route(f"{base}/batches/{{batch_id}}", get, methods=["GET"])
        app.add_api_route(f"{base}/batches/{{batch_id}}/cancel", cancel, methods=["POST"])

    @app.post("/_batch_script")
    async def batch_script(request: Request) -> dict[str, bool]:
        state.script = dict(json.loads(await request.body() or b"{}"))
        state.failures = 0
        return {"scripted": True}

    @app.get("/_batches")
    async def batches() -> dict[str, Any]:
        return {
            "batches": [
                {
                    "id": b.id,
                    "status": b.status,
                    "lines": len(b.requests),
                    "requests": b.requests,
                    "endpoint": b.endpoint,
                    "completion_window": b.completion_window,
                }
                for b in state.batches.values()
            ],
            "uploads": state.uploads,
            "cancels": list(state.cancels),
            "authorizations": list(state.authorizations),
        }

    def release() -> None:
        for batch in state.batches.values():
            if batch.status == "in_progress":
                finish(batch, batch.authorization)

    state.release = release
    app.state.batches = state
    return state
