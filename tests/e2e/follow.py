"""A client following one job's event stream in the background, and the job's artifacts as the
artifacts API lists them: what the long-source and streamed-item tests read."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from tests.e2e.conftest import Api
from tests.sse import Event, events_of
from tests.support import eventually


class Follow:
    """A client following one job's event stream in the background."""

    def __init__(self, api: Api, job_id: str) -> None:
        self.events: list[Event] = []
        self.closed = False
        self._task = asyncio.create_task(self._run(api, job_id))

    async def _run(self, api: Api, job_id: str) -> None:
        path = f"/api/ai/jobs/{job_id}/events"
        async with api.http.stream("GET", path, headers=api.as_user()) as r:
            assert r.status_code == 200
            async for item in events_of(r):
                if isinstance(item, Event):
                    self.events.append(item)
        self.closed = True

    def items(self) -> list[dict[str, Any]]:
        return [e.data for e in self.events if e.event == "item"]

    async def until(self, cond: Any, what: str, timeout: float = 90) -> None:
        async def holds() -> bool:
            if self._task.done():
                self._task.result()
            return bool(cond())

        await eventually(holds, timeout=timeout, interval=0.02, what=what)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


async def all_artifacts(api: Api, job_id: str) -> list[dict[str, Any]]:
    r = await api.http.get(
        f"/api/ai/jobs/{job_id}/artifacts", headers=api.as_user(), params={"limit": 100}
    )
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items
