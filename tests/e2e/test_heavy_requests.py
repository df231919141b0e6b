"""One caller's burst of large creates and quotes takes turns (api/heavy_requests.py), over real
HTTP: at most one of the caller's large requests is in the app at once, another user's large
quote and a read are answered meanwhile, and every request of the burst is answered 200, 202 or
429 `RATE_LIMITED` (with Retry-After), never a 5xx. Checked by counts and codes, not by time:
the burst's first check is held until the others have been answered."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import httpx

from api.heavy_requests import HEAVY_BODY_BYTES
from jobs import token_count
from jobs.requests import CheckedRequest, CreateJobRequest
from tests.e2e.conftest import start_api
from tests.support import eventually

BURST = 8


def large_body(i: int) -> dict[str, Any]:
    text = "".join(
        f"Sentence {n} of text {i} says enzyme{n} speeds reaction{n}. " for n in range(2500)
    )
    assert len(text) > HEAVY_BODY_BYTES
    return {
        "jobType": "quiz_generation",
        "targetType": "lesson",
        "targetId": f"l-{i}",
        "input": {"sourceText": text, "count": 3},
    }


async def test_a_burst_of_large_bodies_takes_turns_and_is_answered(db: Any, env: Any) -> None:
    # Two check threads (one for the burst's first request, one for another user's) and a
    # short wait, for this server only: the gate takes its bounds from the pool.
    token_count.configure(concurrency=2, wait_s=2)
    try:
        await burst_takes_turns(env())
    finally:
        token_count.configure(
            concurrency=token_count.DEFAULT_CONCURRENCY, wait_s=token_count.DEFAULT_WAIT_S
        )


async def burst_takes_turns(settings: Any) -> None:
    async with start_api(settings) as api:
        creation = api.app.state.aijobs.jobs.creation
        real_check = creation.requests.check
        lock, release = threading.Lock(), threading.Event()
        inside: Counter[str] = Counter()
        peak: Counter[str] = Counter()

        def check(req: CreateJobRequest) -> CheckedRequest:
            with lock:
                inside[req.user_id] += 1
                peak[req.user_id] = max(peak[req.user_id], inside[req.user_id])
            try:
                if req.user_id == "heavy":
                    release.wait(30)  # the burst's first check holds its turn
                checked: CheckedRequest = real_check(req)
                return checked
            finally:
                with lock:
                    inside[req.user_id] -= 1

        creation.requests.check = check

        async def send(i: int) -> httpx.Response:
            path = "/api/ai/jobs" if i % 2 else "/api/ai/jobs/quote"
            return await api.http.post(path, json=large_body(i), headers=api.as_user("heavy"))

        burst = [asyncio.create_task(send(i)) for i in range(BURST)]

        async def first_in() -> bool:
            return inside["heavy"] == 1

        await eventually(first_in, timeout=20, what="the burst's first check to start")
        # Another user's large quote and a read are not held behind the burst.
        other = await api.http.post(
            "/api/ai/jobs/quote", json=large_body(99), headers=api.as_user("other")
        )
        assert other.status_code == 200, other.text
        read = await api.http.get("/api/ai/jobs", headers=api.as_user("reader"))
        assert read.status_code == 200, read.text

        async def the_rest_answered() -> bool:
            return sum(t.done() for t in burst) >= BURST - 1

        await eventually(the_rest_answered, timeout=30, what="the waiting requests' answers")
        release.set()
        answers = await asyncio.gather(*burst)
        codes = Counter(f"{r.status_code} {r.json().get('code', '')}".strip() for r in answers)
        assert codes["429 RATE_LIMITED"] == BURST - 1, codes
        assert sum(codes.values()) == BURST and set(codes) <= {"200", "202", "429 RATE_LIMITED"}
        assert all(r.headers.get("retry-after") == "1" for r in answers if r.status_code == 429)
        assert peak["heavy"] == 1  # never two of the caller's large requests in the app
