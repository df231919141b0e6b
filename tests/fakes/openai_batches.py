"""The fake OpenAI server's Files and Batches endpoints (tests/fakes/openai_server.py mounts
them under the same base paths as chat/completions: `/v1/...` and `/...`).

- `POST /files` (multipart, `purpose`=`batch`, `file`): stores the file, answers a file object
  (`id`, `object`, `bytes`, `created_at`, `filename`, `purpose`). `GET /files?purpose=` lists
  the files, newest first (`after`, `limit` 1-10000, `has_more`); `GET /files/{id}` is one;
  `DELETE /files/{id}` deletes it (`{"id", "object": "file", "deleted": true}`): afterwards it
  and its content are 404.
- `POST /batches` (`input_file_id`, `endpoint`, `completion_window`, `metadata`): a batch over
  the file. `GET /batches` lists them newest first, paged as OpenAI pages it: `limit` (1 to
  100, default 20), `after` (a batch id), `has_more`, `first_id`, `last_id`.
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
- `lose_upload` / `lose_create`: N: the first N uploads / creates are made, then answered 502
  as if the answer were lost on the way (a proxy's gateway error).
- `delete_status`: answer every `DELETE /files/{id}` with that HTTP status (nothing deleted).
- `foreign_after_create`: N: after each create, N batches of another client (other metadata,
  their own one-line files) are created, so they are newer and listed before it.

`GET /_batches` reports every batch (`id`, `status`, `lines`: how many requests its file had,
`requests`: the parsed lines, fake data only, `metadata`, `input_file_id`, `output_file_id`,
`error_file_id`, `foreign`: another client's), `uploads` (how many), `upload_log` (per upload:
`file_id`, `filename`, `bytes`, `lines`, the request's `content_length` header and whether it
came `chunked`), `files` (every file: `id`, `filename`, `purpose`, `bytes`, `deleted`),
`deletes` (the ids `DELETE` was asked for, in order), the cancels seen, and the
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
class _File:
    id: str
    filename: str
    purpose: str
    content: bytes = field(repr=False)
    created_at: int
    seq: int  # creation order: newest first in lists (created_at is whole seconds)
    deleted: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
        }


@dataclass
class _Batch:
    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    requests: list[Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    seq: int = 0
    foreign: bool = False
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
            "metadata": self.metadata,
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
        self.seq = itertools.count(1)
        self.files: dict[str, _File] = {}
        self.batches: dict[str, _Batch] = {}
        self.script: dict[str, Any] = {}
        self.uploads = 0
        self.upload_log: list[dict[str, Any]] = []
        self.deletes: list[str] = []
        self.lost = {"lose_upload": 0, "lose_create": 0}
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

    def new_file(self, filename: str, content: bytes, purpose: str) -> _File:
        f = _File(self.new_id("file"), filename, purpose, content, int(time.time()), next(self.seq))
        self.files[f.id] = f
        return f

    def live_file(self, file_id: str) -> _File | None:
        f = self.files.get(file_id)
        return None if f is None or f.deleted else f

    def lose(self, key: str) -> bool:
        """Whether this answer is to be lost (the `lose_*` script counts)."""
        if self.lost[key] >= int(self.script.get(key, 0)):
            return False
        self.lost[key] += 1
        return True


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": code}}, status_code=status)


def _multipart(content_type: str, body: bytes) -> tuple[dict[str, bytes], dict[str, str]]:
    """The fields of a multipart/form-data body, by name, and the file names given (the
    stdlib's MIME parser)."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.message_from_bytes(head + body, policy=email.policy.HTTP)
    fields: dict[str, bytes] = {}
    names: dict[str, str] = {}
    for part in message.iter_parts() if message.is_multipart() else ():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            fields[name] = payload
            filename = part.get_filename()
            if filename:
                names[name] = filename
    return fields, names


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


def _page(rows: list[Any], request: Request, *, most: int, default: int) -> Response:
    """An OpenAI list page of `rows` (newest first): `after` a row's id, `limit` rows."""
    try:
        limit = int(request.query_params.get("limit", default))
    except ValueError:
        limit = -1
    if not 1 <= limit <= most:
        return _error(400, f"limit must be between 1 and {most}", "invalid_request")
    after = request.query_params.get("after")
    if after is not None:
        ids = [r.id for r in rows]
        if after not in ids:
            return _error(400, "no such object to list after", "invalid_request")
        rows = rows[ids.index(after) + 1 :]
    page = rows[:limit]
    return JSONResponse(
        {
            "object": "list",
            "data": [r.as_json() for r in page],
            "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None,
            "has_more": len(rows) > limit,
        }
    )


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
            out_file = state.new_file(f"{batch.id}_output.jsonl", _jsonl(outputs), "batch_output")
            batch.output_file_id = out_file.id
        if errors:
            error_file = state.new_file(f"{batch.id}_error.jsonl", _jsonl(errors), "batch_output")
            batch.error_file_id = error_file.id

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
        raw = await request.body()
        fields, names = _multipart(request.headers.get("content-type", ""), raw)
        if fields.get("purpose") != b"batch" or "file" not in fields:
            return _error(400, "purpose batch and a file are required", "invalid_request")
        f = state.new_file(names.get("file", "upload.jsonl"), fields["file"], "batch")
        state.uploads += 1
        state.upload_log.append(
            {
                "file_id": f.id,
                "filename": f.filename,
                "bytes": len(f.content),
                "lines": len(f.content.splitlines()),
                "content_length": request.headers.get("content-length"),
                "chunked": "chunked" in request.headers.get("transfer-encoding", ""),
                "body_bytes": len(raw),
            }
        )
        if state.lose("lose_upload"):
            return _error(502, "bad gateway", "server_error")
        return JSONResponse(f.as_json())

    async def list_files(request: Request) -> Response:
        state.authorizations.append(request.headers.get("authorization"))
        purpose = request.query_params.get("purpose")
        rows = [
            f
            for f in state.files.values()
            if not f.deleted and (purpose is None or f.purpose == purpose)
        ]
        rows.sort(key=lambda f: f.seq, reverse=True)
        return _page(rows, request, most=10_000, default=10_000)

    async def get_file(file_id: str, request: Request) -> Response:
        state.authorizations.append(request.headers.get("authorization"))
        f = state.live_file(file_id)
        return _error(404, "no such file", "not_found") if f is None else JSONResponse(f.as_json())

    async def delete_file(file_id: str, request: Request) -> Response:
        state.authorizations.append(request.headers.get("authorization"))
        state.deletes.append(file_id)
        if state.script.get("delete_status"):
            return _error(int(state.script["delete_status"]), "scripted failure", "server_error")
        f = state.live_file(file_id)
        if f is None:
            return _error(404, "no such file", "not_found")
        f.deleted = True
        return JSONResponse({"id": f.id, "object": "file", "deleted": True})

    def new_batch(
        input_file: _File, body: dict[str, Any], authorization: str | None, *, foreign: bool
    ) -> _Batch | None:
        lines = _parse_lines(input_file.content)
        if lines is None:
            return None
        meta = body.get("metadata")
        batch = _Batch(
            id=state.new_id("batch"),
            input_file_id=input_file.id,
            endpoint=str(body.get("endpoint")),
            completion_window=str(body.get("completion_window")),
            requests=lines,
            metadata=dict(meta) if isinstance(meta, dict) else {},
            seq=next(state.seq),
            foreign=foreign,
            authorization=authorization,
        )
        state.batches[batch.id] = batch
        return batch

    def foreign_batches(n: int) -> None:
        """Batches of another client, created now (so newer than the one before them)."""
        for k in range(n):
            line = {"custom_id": f"other-{k}", "method": "POST", "url": "/v1/chat/completions"}
            f = state.new_file(f"other-{k}.jsonl", _jsonl([{**line, "body": {}}]), "batch")
            body = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}
            new_batch(f, {**body, "metadata": {"client": "other"}}, None, foreign=True)

    async def create(request: Request) -> Response:
        authorization = request.headers.get("authorization")
        state.authorizations.append(authorization)
        failed = scripted_failure("create_status")
        if failed is not None:
            return failed
        body = json.loads(await request.body())
        input_file = state.live_file(str(body.get("input_file_id")))
        batch = None
        if input_file is not None:
            batch = new_batch(input_file, body, authorization, foreign=False)
        if batch is None:
            return _error(400, "input file missing or not JSONL", "invalid_request")
        if not state.script.get("hold"):
            finish(batch, authorization)
        foreign_batches(int(state.script.get("foreign_after_create", 0)))
        if state.lose("lose_create"):
            return _error(502, "bad gateway", "server_error")
        return JSONResponse(batch.as_json())

    async def list_batches(request: Request) -> Response:
        state.authorizations.append(request.headers.get("authorization"))
        rows = sorted(state.batches.values(), key=lambda b: b.seq, reverse=True)
        return _page(rows, request, most=100, default=20)

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
        f = state.live_file(file_id)
        if f is None:
            return _error(404, "no such file", "not_found")
        return Response(f.content, media_type="application/octet-stream")

    for base in ("/v1", ""):
        app.add_api_route(f"{base}/files", upload, methods=["POST"])
        app.add_api_route(f"{base}/files", list_files, methods=["GET"])
        app.add_api_route(f"{base}/files/{{file_id}}", get_file, methods=["GET"])
        app.add_api_route(f"{base}/files/{{file_id}}", delete_file, methods=["DELETE"])
        app.add_api_route(f"{base}/files/{{file_id}}/content", content, methods=["GET"])
        app.add_api_route(f"{base}/batches", create, methods=["POST"])
        app.add_api_route(f"{base}/batches", list_batches, methods=["GET"])
        app.add_api_route(f"{base}/batches/{{batch_id}}", get, methods=["GET"])
        app.add_api_route(f"{base}/batches/{{batch_id}}/cancel", cancel, methods=["POST"])

    @app.post("/_batch_script")
    async def batch_script(request: Request) -> dict[str, bool]:
        state.script = dict(json.loads(await request.body() or b"{}"))
        state.failures = 0
        state.lost = {"lose_upload": 0, "lose_create": 0}
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
                    "metadata": b.metadata,
                    "input_file_id": b.input_file_id,
                    "output_file_id": b.output_file_id,
                    "error_file_id": b.error_file_id,
                    "foreign": b.foreign,
                }
                for b in state.batches.values()
            ],
            "uploads": state.uploads,
            "upload_log": list(state.upload_log),
            "files": [
                {
                    "id": f.id,
                    "filename": f.filename,
                    "purpose": f.purpose,
                    "bytes": len(f.content),
                    "deleted": f.deleted,
                }
                for f in state.files.values()
            ],
            "deletes": list(state.deletes),
            "cancels": list(state.cancels),
            "authorizations": list(state.authorizations),
        }

    def release() -> None:
        for batch in list(state.batches.values()):
            if batch.status == "in_progress" and not batch.foreign:
                finish(batch, batch.authorization)

    state.release = release
    app.state.batches = state
    return state
