"""A batch's submission, made idempotent: never two provider batches for one engine batch, however
an answer was lost (a timeout, a dropped connection, a 5xx, a crash, a database error after the
request).

- The input file is named after the engine's batch (`ai-batch-{id}.jsonl`) and streamed from
  the database (db/batch_uploads.py) with its `Content-Length`; the start of the first upload
  is recorded before it. A later attempt that finds a start but no recorded file looks for the
  file by its name first (`GET /files?purpose=batch`): found, it is adopted (and any other
  upload of the same name is an orphan, deleted), so a lost upload answer costs no second file.
- The input file's id is recorded before the batch is created over it. A later attempt that
  finds it recorded (a create may have been sent) looks for the batch first (`GET /batches`,
  paged): the one whose `metadata.ai_batch_id` is this batch's is adopted instead of creating
  another.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from db import batch_files as files_db
from db import batch_uploads as uploads_db
from db.batch_uploads import Upload
from db.session import SessionMaker
from providers.batch import BatchClient, ProviderBatch, ProviderFile
from providers.batch_lines import encode_line

METADATA_KEY = "ai_batch_id"
# The provider's clock may differ from ours: what it created within this long before our upload
# began is still looked at.
CLOCK_SKEW_S = 3600.0
# Lines are sent in pieces of about this many bytes.
PIECE_BYTES = 64 * 1024


def file_name(batch_id: uuid.UUID) -> str:
    return f"ai-batch-{batch_id}.jsonl"


@dataclass
class Submitted:
    """What the provider holds for the batch: its batch (None: the file had no line), the input
    file, and whether a create may have been sent (its outcome unknown until it is found)."""

    batch: ProviderBatch | None
    input_file_id: str | None
    create_sent: bool


class Submission:
    """One submit attempt of one closed batch (module docstring)."""

    def __init__(self, sm: SessionMaker, client: BatchClient, upload: Upload) -> None:
        self._sm = sm
        self._client = client
        self._up = upload
        batch = upload.batch
        self.batch_id = batch.id
        self.input_file_id = batch.input_file_id
        # A recorded input file means an earlier attempt may have sent the create.
        self.create_sent = batch.input_file_id is not None
        began = upload.started_at or batch.created_at
        self._since = began.timestamp() - CLOCK_SKEW_S
        self.orphans: list[str] = []

    async def run(self) -> Submitted:
        if self.input_file_id is None:
            self.input_file_id = await self._input_file()
            if self.input_file_id is None:
                return Submitted(None, None, create_sent=False)
            async with self._sm.begin() as s:
                await uploads_db.set_input_file(s, self.batch_id, self.input_file_id)
                await files_db.record(s, self.batch_id, [(self.input_file_id, files_db.INPUT)])
        else:
            found = await self._client.find_batch(
                METADATA_KEY, str(self.batch_id), since=self._since
            )
            if found is not None:
                return Submitted(found, self.input_file_id, create_sent=True)
        self.create_sent = True
        created = await self._client.create(
            self.input_file_id, metadata={METADATA_KEY: str(self.batch_id)}
        )
        return Submitted(created, self.input_file_id, create_sent=True)

    async def _input_file(self) -> str | None:
        """The batch's file at the provider: one an earlier attempt uploaded (its answer lost),
        else a new upload; None when the file would hold no line."""
        if not self._up.first:
            found = await self.uploads()
            if found:
                keep = max(found, key=lambda f: (f.created_at or 0.0, f.id))
                await self._orphaned([f.id for f in found if f.id != keep.id])
                return keep.id
        async with self._sm.begin() as s:
            size = await uploads_db.file_size(s, self.batch_id)
            if size.lines == 0:
                return None
            total = size.bytes
            if size.unsized:  # lines enrolled before sizes were counted: measured first
                total = await _measured(uploads_db.file_lines(s, self.batch_id))
            pieces = _pieces(uploads_db.file_lines(s, self.batch_id))
            return await self._client.upload_stream(file_name(self.batch_id), total, pieces)

    async def uploads(self) -> list[ProviderFile]:
        """The uploads of this batch's file at the provider (found by its name)."""
        return await self._client.find_files(file_name(self.batch_id), since=self._since)

    async def _orphaned(self, file_ids: list[str]) -> None:
        """Uploads no batch will use: recorded, so that they are deleted."""
        if file_ids:
            async with self._sm.begin() as s:
                await files_db.record(s, self.batch_id, [(f, files_db.ORPHAN) for f in file_ids])
            self.orphans += file_ids


async def _measured(lines: AsyncIterator[uploads_db.FileLine]) -> int:
    return sum([len(encode_line(line.custom_id, line.body)) async for line in lines])


async def _pieces(lines: AsyncIterator[uploads_db.FileLine]) -> AsyncIterator[bytes]:
    """The file's bytes, a piece of about PIECE_BYTES at a time. Each line is checked against
    the size counted at its enroll: the `Content-Length` sent first must be the truth."""
    buffer = bytearray()
    async for line in lines:
        data = encode_line(line.custom_id, line.body)
        if line.line_bytes and len(data) != line.line_bytes:
            raise RuntimeError("a batch line's size differs from the size counted at its enroll")
        buffer += data
        if len(buffer) >= PIECE_BYTES:
            yield bytes(buffer)
            buffer.clear()
    if buffer:
        yield bytes(buffer)
