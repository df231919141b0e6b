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
`error_file_id`, `foreign`: another client's, `polls`: how often it was asked about),
`uploads` (how many), `upload_log` (per upload:
`file_id`, `filename`, `bytes`, `lines`, the request's `content_length` header and whether it
came `chunked`), `files` (every file: `id`, `filename`, `purpose`, `bytes`, `deleted`),
`deletes` (the ids `DELETE` was asked for, in order), the cancels seen, and the
`Authorization` headers of the batch calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tests.fakes.openai_batch_objects import (
    BatchState,
    FakeBatch,
    FakeFile,
    error,
    jsonl,
    multipart,
    page,
    parse_lines,
)

AnswerLine = Callable[[str | None, dict[str, Any]], tuple[int, Any]]


def install_batch_routes(app: FastAPI, answer_line: AnswerLine) -> BatchState:
    """Mount the Files and Batches endpoints and their controls on `app`."""
    state = BatchState()

    def scripted_failure(key: str) -> JSONResponse | None:
        status = state.script.get(key)
        times = state.script.get("fail_times")
        if status is None or (times is not None and state.failures >= int(times)):
            return None
        state.failures += 1
        return error(int(status), "scripted batch failure", "server_error")

    def run(batch: FakeBatch, authorization: str | None, *, answer: int | None) -> None:
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
            out_file = state.new_file(f"{batch.id}_output.jsonl", jsonl(outputs), "batch_output")
            batch.output_file_id = out_file.id
        if errors:
            error_file = state.new_file(f"{batch.id}_error.jsonl", jsonl(errors), "batch_output")
            batch.error_file_id = error_file.id

    def finish(batch: FakeBatch, authorization: str | None) -> None:
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
        fields, names = multipart(request.headers.get("content-type", ""), raw)
        if fields.get("purpose") != b"batch" or "file" not in fields:
            return error(400, "purpose batch and a file are required", "invalid_request")
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
            return error(502, "bad gateway", "server_error")
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
        return page(rows, request, most=10_000, default=10_000)

    async def get_file(file_id: str, request: Request) -> Response:
        state.authorizations.append(request.headers.get("authorization"))
        f = state.live_file(file_id)
        return error(404, "no such file", "not_found") if f is None else JSONResponse(f.as_json())

    async def delete_file(file_id: str, request: Request) -> Response:
        state.authorizations.append(request.headers.get("authorization"))
        state.deletes.append(file_id)
        if state.script.get("delete_status"):
            return error(int(state.script["delete_status"]), "scripted failure", "server_error")
        f = state.live_file(file_id)
        if f is None:
            return error(404, "no such file", "not_found")
        f.deleted = True
        return JSONResponse({"id": f.id, "object": "file", "deleted": True})

    def new_batch(
        input_file: FakeFile, body: dict[str, Any], authorization: str | None, *, foreign: bool
    ) -> FakeBatch | None:
        lines = parse_lines(input_file.content)
        if lines is None:
            return None
        meta = body.get("metadata")
        batch = FakeBatch(
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
            f = state.new_file(f"other-{k}.jsonl", jsonl([{**line, "body": {}}]), "batch")
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
            return error(400, "input file missing or not JSONL", "invalid_request")
        if not state.script.get("hold"):
            finish(batch, authorization)
        foreign_batches(int(state.script.get("foreign_after_create", 0)))
        if state.lose("lose_create"):
            return error(502, "bad gateway", "server_error")
        return JSONResponse(batch.as_json())

    async def list_batches(request: Request) -> Response:
        state.authorizations.append(request.headers.get("authorization"))
        rows = sorted(state.batches.values(), key=lambda b: b.seq, reverse=True)
        return page(rows, request, most=100, default=20)

    async def get(batch_id: str, request: Request) -> Response:
        state.authorizations.append(request.headers.get("authorization"))
        batch = state.batches.get(batch_id)
        if batch is None:
            return error(404, "no such batch", "not_found")
        batch.polls += 1
        return JSONResponse(batch.as_json())

    async def cancel(batch_id: str, request: Request) -> Response:
        authorization = request.headers.get("authorization")
        state.authorizations.append(authorization)
        batch = state.batches.get(batch_id)
        if batch is None:
            return error(404, "no such batch", "not_found")
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
            return error(404, "no such file", "not_found")
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
                    "polls": b.polls,
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
