"""The API's per-user limits hold across API processes: two `aijobs api` processes on the
session's database, a flood of one user's quotes spread over both, and one user's event streams
opened on both."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import httpx

from api.auth import JwtConfig, issue_token
from api.routes.events import MAX_STREAMS_PER_USER
from tests.e2e.api_processes import api_processes
from tests.e2e.conftest import assert_problem, bearer
from tests.stack import make_settings
from tests.support import eventually

QUOTE = {"jobType": "synthetic", "targetType": "lesson", "targetId": "l-1", "input": {}}
BURST = 5


def as_user(database_url: str, temporal_address: str, user: str) -> dict[str, str]:
    cfg = JwtConfig.from_settings(make_settings(database_url, temporal_address))
    return bearer(issue_token(cfg, user, ttl_s=600))


async def test_a_quote_flood_is_limited_across_processes_and_streams_are_capped_per_user(
    db: object, database_url: str, temporal_address: str, tmp_path: Path
) -> None:
    flooder = as_user(database_url, temporal_address, "flooder")
    other = as_user(database_url, temporal_address, "other")
    with api_processes(
        database_url,
        temporal_address,
        tmp_path,
        API_RATE_LIMIT_PER_MINUTE="60",  # one a second
        API_RATE_LIMIT_BURST=str(BURST),
    ) as (a, b):
        async with httpx.AsyncClient(timeout=30) as http:
            started = time.monotonic()
            answers = [
                await http.post(f"{url}/api/ai/jobs/quote", json=QUOTE, headers=flooder)
                for url in (a, b) * 8
            ]
            elapsed = time.monotonic() - started
            ok = [r for r in answers if r.status_code == 200]
            limited = [r for r in answers if r.status_code != 200]
            # One bucket for both processes: the burst and what refilled meanwhile, no more
            # (two per-process buckets would have let through twice the burst).
            assert BURST <= len(ok) <= BURST + int(elapsed) + 1, (len(ok), elapsed)
            assert limited
            for r in limited:
                assert_problem(r, 429, "RATE_LIMITED")
                assert int(r.headers["Retry-After"]) >= 1
            # The next user is not touched by it, on either process; reads are not limited.
            for url in (a, b):
                r = await http.post(f"{url}/api/ai/jobs/quote", json=QUOTE, headers=other)
                assert r.status_code == 200, r.text
                assert (await http.get(f"{url}/api/ai/jobs", headers=flooder)).status_code == 200

            # The user's whole share of streams in the cluster: held on A, refused on B.
            async with contextlib.AsyncExitStack() as held:
                for _ in range(MAX_STREAMS_PER_USER):
                    r = await held.enter_async_context(
                        http.stream("GET", f"{a}/api/ai/jobs/events", headers=flooder)
                    )
                    assert r.status_code == 200
                refused = await http.get(f"{b}/api/ai/jobs/events", headers=flooder)
                assert_problem(refused, 429, "TOO_MANY_STREAMS")
                async with http.stream("GET", f"{b}/api/ai/jobs/events", headers=other) as o:
                    assert o.status_code == 200

            # A closed: its lease is released, and B serves the user's stream.
            async def b_serves() -> bool:
                async with http.stream("GET", f"{b}/api/ai/jobs/events", headers=flooder) as r:
                    return r.status_code == 200

            await eventually(b_serves, timeout=15, what="B to serve the freed stream slot")
