"""The README's quickstart, end to end: the synthetic job's artifact shows the `echo` that went
through the job, and `curl -N` on its event stream follows it to its end."""

from __future__ import annotations

import asyncio

from tests.e2e.conftest import Api
from tests.sse import Event, events_of
from tests.stack import Stack


async def test_the_synthetic_artifact_contains_the_echo(api: Api, workers: Stack) -> None:
    echo = {"hello": "world", "n": [1, 2]}
    job_id = await api.create_id(input={"echo": echo})
    states: list[str] = []
    async with asyncio.timeout(30):
        path = f"/api/ai/jobs/{job_id}/events"
        async with api.http.stream("GET", path, headers=api.as_user()) as r:
            assert r.status_code == 200
            async for item in events_of(r):
                if isinstance(item, Event):
                    states.append(item.data["lifecycleStatus"])
    assert states[-1] == "succeeded", states  # the stream ends after the terminal state
    r = await api.http.get(f"/api/ai/jobs/{job_id}/artifacts", headers=api.as_user())
    assert r.status_code == 200, r.text
    (item,) = r.json()["items"]
    assert item["artifactType"] == "synthetic_result"
    assert item["content"]["echo"] == echo
    assert item["content"]["outputHash"]
