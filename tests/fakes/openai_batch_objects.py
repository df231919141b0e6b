"""The objects of the fake OpenAI server's Files and Batches endpoints
(tests/fakes/openai_batches.py): files, batches and their state, the multipart and JSONL
parsing, and OpenAI's list pages."""

from __future__ import annotations

import email
import email.policy
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response


@dataclass
class FakeFile:
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
class FakeBatch:
    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    requests: list[Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    seq: int = 0
    foreign: bool = False
    polls: int = 0  # GET /batches/{id} asked
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
        self.files: dict[str, FakeFile] = {}
        self.batches: dict[str, FakeBatch] = {}
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

    def new_file(self, filename: str, content: bytes, purpose: str) -> FakeFile:
        f = FakeFile(
            self.new_id("file"), filename, purpose, content, int(time.time()), next(self.seq)
        )
        self.files[f.id] = f
        return f

    def live_file(self, file_id: str) -> FakeFile | None:
        f = self.files.get(file_id)
        return None if f is None or f.deleted else f

    def lose(self, key: str) -> bool:
        """Whether this answer is to be lost (the `lose_*` script counts)."""
        if self.lost[key] >= int(self.script.get(key, 0)):
            return False
        self.lost[key] += 1
        return True


def error(status: int, message: str, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": code}}, status_code=status)


def multipart(content_type: str, body: bytes) -> tuple[dict[str, bytes], dict[str, str]]:
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


def parse_lines(content: bytes) -> list[Any] | None:
    lines = []
    for text in content.decode().splitlines():
        if text.strip():
            try:
                lines.append(json.loads(text))
            except ValueError:
                return None
    return lines


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def page(rows: list[Any], request: Request, *, most: int, default: int) -> Response:
    """An OpenAI list page of `rows` (newest first): `after` a row's id, `limit` rows."""
    try:
        limit = int(request.query_params.get("limit", default))
    except ValueError:
        limit = -1
    if not 1 <= limit <= most:
        return error(400, f"limit must be between 1 and {most}", "invalid_request")
    after = request.query_params.get("after")
    if after is not None:
        ids = [r.id for r in rows]
        if after not in ids:
            return error(400, "no such object to list after", "invalid_request")
        rows = rows[ids.index(after) + 1 :]
    shown = rows[:limit]
    return JSONResponse(
        {
            "object": "list",
            "data": [r.as_json() for r in shown],
            "first_id": shown[0].id if shown else None,
            "last_id": shown[-1].id if shown else None,
            "has_more": len(rows) > limit,
        }
    )
