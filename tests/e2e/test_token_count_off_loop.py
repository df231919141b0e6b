"""A create's or quote's token counting runs off the event loop: while a maximum-size quote is
being counted, another user's read is served. Checked by order, not by time: the count waits
for the read to have been answered, which a count on the loop could never see."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from jobs.requests import CheckedRequest, CreateJobRequest
from tests.e2e.conftest import start_api
from tests.support import eventually

MAX_SOURCE_CHARS = 400_000


def long_source(chars: int) -> str:
    """Distinct sentences, so the tokenizer sees no repeated text."""
    parts, size, i = [], 0, 0
    while size < chars:
        p = f"Paragraph {i} says that enzyme{i} catalysts speed up reaction{i} in cells. "
        parts.append(p)
        size, i = size + len(p), i + 1
    return "".join(parts)[:chars]


async def test_a_read_is_served_while_a_maximum_size_quote_is_counted(db: Any, env: Any) -> None:
    async with start_api(env()) as api:
        creation = api.app.state.aijobs.jobs.creation
        real_check = creation.requests.check
        counting, read_answered = threading.Event(), threading.Event()
        released_by_read: list[bool] = []

        def check(req: CreateJobRequest) -> CheckedRequest:
            counting.set()
            # The real count and chunk plan of 400k characters.
            checked: CheckedRequest = real_check(req)
            # Still inside the check: finish only once the read has been answered (bounded,
            # so a count on the loop fails this test instead of hanging it).
            released_by_read.append(read_answered.wait(20))
            return checked

        creation.requests.check = check
        body = {
            "jobType": "quiz_generation",
            "targetType": "lesson",
            "targetId": "l-1",
            "input": {"sourceText": long_source(MAX_SOURCE_CHARS), "count": 5},
        }
        quote = asyncio.create_task(
            api.http.post("/api/ai/jobs/quote", json=body, headers=api.as_user("heavy"))
        )

        async def started() -> bool:
            return counting.is_set()

        await eventually(started, timeout=20, what="the quote's check to start")
        read = await api.http.get("/api/ai/jobs", headers=api.as_user("reader"))
        assert read.status_code == 200, read.text
        read_answered.set()
        answered = await quote
        assert answered.status_code == 200, answered.text
        assert answered.json()["estimatedInputTokens"] > 50_000
        assert released_by_read == [True]
