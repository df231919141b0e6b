"""Jobs over long sources: the plan (which chunks, how many items each), each chunk's input,
and the merge of the chunks' outputs into one output of the job type's schema.

A job type opts in with a `ChunkSpec` (jobs/spec.py). At create, a source whose prompt would
exceed the per-call input budget (AI_CHUNK_INPUT_TOKENS, never more than the model's window
leaves beside the answer budget) is split by `engine.chunking.plan_chunks` at paragraph and
sentence boundaries with a small overlap; the requested count is spread over the chunks by
their size, and each chunk is asked for one item more than its share when there are several
(overlapping chunks can yield the same item twice; the merge drops duplicates and cuts at the
requested count). A source that fits one prompt makes exactly one call, as before.

Chunks whose share of a small count is 0 are left out of the plan: with fewer items asked than
chunks, the largest chunks are the ones asked.

Everything here is pure and deterministic: create, EXECUTE and a retry compute the same plan
from the same input and settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from db.chunks import PlannedChunk
from engine.chunking import merge_items, plan_chunks, spread_count
from engine.tokens import count_chat_tokens
from jobs.spec import AnyJobType, ChunkSpec, Prompt

# Tokens two neighbouring chunks share at most (a tenth of the chunk budget when smaller): a
# sentence cut by a boundary is read whole by one of them.
OVERLAP_TOKENS = 200
# The smallest chunk budget worth a call: below it the prompt's own text dominates.
MIN_CHUNK_TOKENS = 256


@dataclass(frozen=True)
class ChunkPolicy:
    max_input_tokens: int = 16_000  # AI_CHUNK_INPUT_TOKENS
    overlap_tokens: int = OVERLAP_TOKENS


def spec_of(jt: AnyJobType) -> ChunkSpec | None:
    return jt.chunking


def chunk_input(jt: AnyJobType, inp: BaseModel, source: str, item_count: int) -> BaseModel:
    """The job's input as one chunk's call sees it: its part of the source and its share of
    the items."""
    spec = jt.chunking
    assert spec is not None
    return inp.model_copy(update={spec.source_field: source, spec.count_field: item_count})


def chunk_model(jt: AnyJobType, inp: BaseModel, chunk: PlannedChunk) -> BaseModel:
    """The input of one planned chunk's call, cut from the job's whole input."""
    spec = jt.chunking
    assert spec is not None
    source: str = getattr(inp, spec.source_field)
    return chunk_input(jt, inp, source[chunk.start_char : chunk.end_char], chunk.item_count)


def chunk_prompt(jt: AnyJobType, inp: BaseModel, chunk: PlannedChunk) -> Prompt:
    return jt.prompt(chunk_model(jt, inp, chunk), None)


def plan(
    jt: AnyJobType, inp: BaseModel, policy: ChunkPolicy, *, window_budget: int | None = None
) -> list[PlannedChunk] | None:
    """The job's chunks, or None when its prompt fits one call (or the type never chunks).
    `window_budget`: the most prompt tokens the model's window leaves beside the answer budget
    (None: no window known); the per-call budget never exceeds it."""
    spec = jt.chunking
    if spec is None:
        return None
    budget = policy.max_input_tokens
    if window_budget is not None:
        budget = min(budget, window_budget)
    whole = jt.prompt(inp, None)
    if count_chat_tokens(whole.system, whole.user) <= budget:
        return None
    source: str = getattr(inp, spec.source_field)
    count: int = getattr(inp, spec.count_field)
    # What the prompt costs around its source: the per-call budget less this is the chunk's.
    frame = jt.prompt(chunk_input(jt, inp, "", count), None)
    chunk_budget = budget - count_chat_tokens(frame.system, frame.user)
    if chunk_budget < MIN_CHUNK_TOKENS:
        return None  # no chunk would be worth a call: the job is refused as too large
    chunks = plan_chunks(
        source,
        max_tokens=chunk_budget,
        overlap_tokens=min(policy.overlap_tokens, chunk_budget // 10),
    )
    if len(chunks) <= 1:
        return None
    shares = spread_count(count, [c.tokens for c in chunks], at_least=1)
    planned: list[PlannedChunk] = []
    for chunk, share in zip(chunks, shares, strict=True):
        if share <= 0:
            continue
        asked = min(share + 1, spec.max_items_per_call)
        provisional = PlannedChunk(len(planned), chunk.start, chunk.end, 0, asked)
        prompt = chunk_prompt(jt, inp, provisional)
        planned.append(
            PlannedChunk(
                provisional.chunk_no,
                chunk.start,
                chunk.end,
                count_chat_tokens(prompt.system, prompt.user),
                asked,
            )
        )
    return planned


def merge_outputs(
    jt: AnyJobType, outputs: Sequence[Mapping[str, Any]], count: int
) -> dict[str, Any]:
    """One output of the job type's schema from the chunks' outputs, in chunk order: items
    whose key normalises the same as an earlier one dropped, cut at the requested count."""
    spec = jt.chunking
    assert spec is not None
    merged = merge_items(
        [list(o.get(spec.items_field, [])) for o in outputs], key=spec.item_key, limit=count
    )
    return {spec.items_field: merged}
