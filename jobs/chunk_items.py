"""The items of a long-source job's succeeded chunks, as clients see them before the job ends
(the artifact page, jobs/views.py, and the event stream, api/routes/events.py).

No business row exists for them yet: an item is named by its place (chunk, index within the
chunk) and its fields are shown in camelCase, the names the artifact views use for the same
fields. The final artifacts replace them once the job's merge has run.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from pydantic.alias_generators import to_camel
from sqlalchemy.ext.asyncio import AsyncSession

from db.chunks import SucceededChunk, succeeded_chunks
from jobs.spec import Catalog

# An item of a long source's chunk before the job ends: no business row exists yet, so it is
# named by its place, (chunk, index within the chunk), and typed by this name.
CHUNK_ITEM_TYPE = "chunk_item"


@dataclass(frozen=True)
class ChunkItem:
    """One item of a succeeded chunk's output, as clients see it before the merge."""

    chunk: int
    ordinal: int
    content: dict[str, Any]


def item_content(item: Any) -> dict[str, Any]:
    """A chunk's output item as a client sees it: its fields in camelCase (the names the
    artifact views use for the same fields)."""
    if not isinstance(item, dict):
        return {"value": item}
    return {to_camel(str(k)): v for k, v in item.items()}


def chunk_items(catalog: Catalog, job_type: str, chunk: SucceededChunk) -> list[ChunkItem]:
    """The items of one succeeded chunk, in the chunk's order (empty for a type that does not
    chunk)."""
    spec = catalog.get(job_type).chunking if job_type in catalog else None
    if spec is None:
        return []
    items = chunk.output.get(spec.items_field) or []
    return [ChunkItem(chunk.chunk_no, n, item_content(it)) for n, it in enumerate(items)]


async def landed_chunks(
    session: AsyncSession, job_id: uuid.UUID, *, exclude: list[int] | None = None
) -> list[SucceededChunk]:
    """The job's succeeded chunks but those in `exclude` (a stream's already sent)."""
    return await succeeded_chunks(session, job_id, exclude=exclude or ())
