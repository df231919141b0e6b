"""A long source is planned at create: its chunks stored in PostgreSQL (ranges, never text), its
whole worst case (every chunk's call) quoted and reserved, a per-job cap spread over the calls;
a short source stays one call."""

from __future__ import annotations

import dataclasses
import itertools
from decimal import Decimal
from typing import Any

from sqlalchemy import text

from db.session import SessionMaker
from jobs.service import CreateJobRequest, CreatePolicy, JobService
from jobs.types import default_catalog

PRICED = CreatePolicy(
    max_active_jobs=0, max_jobs_per_day=0, model="deepseek-chat", platform_synthetic=False
)
PARAGRAPH = (
    "Photosynthesis turns light into chemical energy. It happens in the chloroplasts of plant "
    "cells, where chlorophyll absorbs red and blue light. The Calvin cycle then fixes carbon "
    "dioxide into sugars that the plant uses to grow.\n\n"
)
LONG = (PARAGRAPH * 2000)[:400_000]


def quiz(source: str, target: str = "t", **kw: Any) -> CreateJobRequest:
    return CreateJobRequest(
        user_id="u1",
        job_type="quiz_generation",
        target_type="test",
        target_id=target,
        input={"sourceText": source, "count": 20},
        **kw,
    )


async def chunk_rows(sm: SessionMaker, job_id: object) -> list[Any]:
    async with sm() as s:
        return list(
            await s.execute(
                text(
                    "SELECT chunk_no, start_char, end_char, input_tokens, item_count, status "
                    "FROM ai_job_chunk WHERE job_id = :j ORDER BY chunk_no"
                ),
                {"j": job_id},
            )
        )


async def test_a_long_source_is_planned_as_chunks_at_create(db: SessionMaker) -> None:
    svc = JobService(db, default_catalog(), PRICED)
    quote = await svc.quote(quiz(LONG))
    job = (await svc.create(quiz(LONG))).job
    rows = await chunk_rows(db, job.id)
    assert job.chunk_count == len(rows) >= 5
    assert [r.chunk_no for r in rows] == list(range(len(rows)))
    # Every character is in a chunk; chunks overlap a little and stay in order.
    assert rows[0].start_char == 0 and rows[-1].end_char == len(LONG)
    for a, b in itertools.pairwise(rows):
        assert a.start_char < b.start_char <= a.end_char < b.end_char
    # Each call's prompt stays within the per-call budget (16k tokens by default).
    assert all(0 < r.input_tokens <= 16_000 for r in rows)
    assert all(r.status == "pending" for r in rows)
    # The count is spread over the chunks, each asked for one more (overlaps can repeat items).
    assert sum(r.item_count for r in rows) == 20 + len(rows)
    # The whole job is quoted and reserved: every chunk's call.
    e = quote.checked.estimate
    assert e.calls == len(rows)
    assert e.input_tokens == sum(r.input_tokens for r in rows) == job.estimated_input_tokens
    assert job.reserved_cost_usd == e.worst_case_cost_usd > e.call_worst_case_usd * (len(rows) - 1)


async def test_a_short_source_stays_one_call(db: SessionMaker) -> None:
    job = (await JobService(db, default_catalog(), PRICED).create(quiz(PARAGRAPH * 3))).job
    assert job.chunk_count is None
    assert await chunk_rows(db, job.id) == []


async def test_a_cost_cap_holds_across_the_chunks(db: SessionMaker) -> None:
    svc = JobService(db, default_catalog(), PRICED)
    full = (await svc.quote(quiz(LONG))).checked.estimate
    cap = (full.worst_case_cost_usd * 3 / 4).quantize(Decimal("0.00000001"))
    job = (await svc.create(quiz(LONG, max_cost_usd=cap))).job
    assert job.reserved_cost_usd <= cap
    assert job.max_output_tokens is not None and job.max_output_tokens < 4096


async def test_a_smaller_per_call_budget_makes_more_chunks(db: SessionMaker) -> None:
    small = dataclasses.replace(
        PRICED, chunking=dataclasses.replace(PRICED.chunking, max_input_tokens=4_000)
    )
    job = (await JobService(db, default_catalog(), small).create(quiz(LONG))).job
    rows = await chunk_rows(db, job.id)
    assert all(r.input_tokens <= 4_000 for r in rows)
    # 20 items over more than 20 chunks: the largest chunks are asked, one item each (plus one).
    assert len(rows) == 20
