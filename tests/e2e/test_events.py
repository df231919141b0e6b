"""Job status streams (server-sent events) over real HTTP: woken by PostgreSQL LISTEN/NOTIFY,
closed after a terminal state, resumable with Last-Event-ID, one hub queue per client."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from api.events import STREAM_RETRY_AFTER_S, JobEventHub, StreamSlots
from api.routes import events as events_route
from db import jobs as jobs_db
from tests.e2e.conftest import Api, assert_problem, start_api
from tests.sse import Event, events_of
from tests.stack import INTERACTIVE, Stack, engine_stack
from tests.support import eventually


def hub(api: Api) -> JobEventHub:
    h: JobEventHub = api.app.state.aijobs.events
    return h


async def collect(
    api: Api, path: str, headers: dict[str, str], *, until: Any, timeout: float = 30
) -> tuple[list[Event], bool]:
    """Reads `path` until `until(events)` is true or the server closes it: (events, closed)."""
    got: list[Event] = []
    closed = False
    async with asyncio.timeout(timeout):
        async with api.http.stream("GET", path, headers=headers) as r:
            assert r.status_code == 200, await r.aread()
            assert r.headers["content-type"].startswith("text/event-stream")
            async for item in events_of(r):
                if isinstance(item, Event):
                    got.append(item)
                    if until(got):
                        return got, False
            closed = True
    return got, closed


async def wait_for(cond: Callable[[], bool], timeout: float = 10) -> None:
    """Until `cond()` holds (state of the in-process hub, or events collected so far)."""

    async def holds() -> bool:
        return cond()

    await eventually(holds, timeout=timeout, interval=0.02, what="the condition")


async def test_a_job_stream_follows_it_to_succeeded_and_closes(api: Api, workers: Stack) -> None:
    job_id = await api.create_id(input={"delayMs": 1500})
    events, closed = await collect(
        api, f"/api/ai/jobs/{job_id}/events", api.as_user(), until=lambda _: False
    )
    assert closed
    states = [e.data["lifecycleStatus"] for e in events]
    assert states[0] == "queued" or states[0] == "running", states
    for wanted in ("running", "succeeded"):
        assert wanted in states, states
    assert states[-1] == "succeeded"
    assert states.index("running") < states.index("succeeded")
    assert all(e.event == "status" for e in events)
    ids = [int(e.id or 0) for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), ids
    assert events[-1].data["result"]["artifactCount"] == 1
    assert events[-1].data["jobId"] == job_id


async def test_queued_running_succeeded_in_order(api: Api, env: Any, temporal_client: Any) -> None:
    """Without workers the job stays queued; the stream shows it, then the workers start."""
    job_id = await api.create_id(input={"delayMs": 800})
    path = f"/api/ai/jobs/{job_id}/events"
    got: list[Event] = []

    async def read() -> None:
        async with api.http.stream("GET", path, headers=api.as_user()) as r:
            async for item in events_of(r):
                if isinstance(item, Event):
                    got.append(item)

    reader = asyncio.create_task(read())
    await wait_for(lambda: len(got) >= 1)
    assert got[0].data["lifecycleStatus"] == "queued"
    async with engine_stack(env(), temporal_client, queues=INTERACTIVE):
        await asyncio.wait_for(reader, 60)
    states = [e.data["lifecycleStatus"] for e in got]
    assert states[0] == "queued" and states[-1] == "succeeded"
    assert states.index("queued") < states.index("running") < states.index("succeeded")


async def test_last_event_id_resumes(api: Api, workers: Stack) -> None:
    job_id = await api.create_id()
    done = await api.wait_status(job_id)
    assert done["lifecycleStatus"] == "succeeded"
    path = f"/api/ai/jobs/{job_id}/events"
    events, closed = await collect(api, path, api.as_user(), until=lambda _: False)
    assert closed and [e.data["lifecycleStatus"] for e in events] == ["succeeded"]
    last = events[-1].id
    assert last is not None
    # Already seen: nothing is sent, the stream ends at once.
    again, closed = await collect(
        api, path, {**api.as_user(), "Last-Event-ID": last}, until=lambda _: False
    )
    assert closed and again == []
    # An older id: the current state is sent.
    older, closed = await collect(
        api, path, {**api.as_user(), "Last-Event-ID": str(int(last) - 1)}, until=lambda _: False
    )
    assert closed and [e.id for e in older] == [last]
    bad = await api.http.get(path, headers={**api.as_user(), "Last-Event-ID": "x"})
    assert_problem(bad, 422, "VALIDATION_FAILED")


async def test_other_users_and_missing_jobs_get_404(api: Api) -> None:
    job_id = await api.create_id()
    theirs = await api.http.get(f"/api/ai/jobs/{job_id}/events", headers=api.as_user("bob"))
    missing = await api.http.get(f"/api/ai/jobs/{uuid.uuid4()}/events", headers=api.as_user())
    assert_problem(theirs, 404, "JOB_NOT_FOUND")
    assert theirs.json() == missing.json()
    assert_problem(await api.http.get(f"/api/ai/jobs/{job_id}/events"), 401, "UNAUTHENTICATED")
    # An admin may follow anyone's job.
    events, _ = await collect(
        api, f"/api/ai/jobs/{job_id}/events", api.as_admin(), until=lambda ev: len(ev) >= 1
    )
    assert events[0].data["lifecycleStatus"] == "queued"


async def test_the_all_jobs_stream_sees_two_jobs(api: Api, workers: Stack) -> None:
    got: list[Event] = []
    before = hub(api).subscriber_count

    async def read() -> None:
        async with api.http.stream("GET", "/api/ai/jobs/events", headers=api.as_user()) as r:
            assert r.status_code == 200
            async for item in events_of(r):
                if isinstance(item, Event):
                    got.append(item)

    reader = asyncio.create_task(read())
    try:
        await wait_for(lambda: hub(api).subscriber_count == before + 1)
        first = await api.create_id()
        second = await api.create_id()
        await api.create_id("bob")  # not alice's: never on her stream

        def finished() -> set[str]:
            return {e.data["jobId"] for e in got if e.data["lifecycleStatus"] == "succeeded"}

        await wait_for(lambda: finished() == {first, second}, timeout=30)
        assert {e.data["jobId"] for e in got} == {first, second}
        assert not reader.done()  # not closed by a terminal state
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
    await wait_for(lambda: hub(api).subscriber_count == before)


async def test_a_disconnecting_client_frees_its_queue(api: Api) -> None:
    job_id = await api.create_id()
    before = hub(api).subscriber_count
    streams = []
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(5):
            r = await stack.enter_async_context(
                api.http.stream("GET", f"/api/ai/jobs/{job_id}/events", headers=api.as_user())
            )
            streams.append(r)
        await wait_for(lambda: hub(api).subscriber_count == before + 5)
    await wait_for(lambda: hub(api).subscriber_count == before)


async def test_keep_alive_comments_and_reconnect(db: Any, env: Any, workers: Stack) -> None:
    """A short ping interval shows the keep-alive comments; a dropped LISTEN connection is
    re-established and the stream still sees the job end."""
    async with start_api(env(SSE_PING_S=0.2)) as fast:
        job_id = await fast.create_id(input={"delayMs": 2500})
        comments: list[str] = []
        got: list[Event] = []

        async def read() -> None:
            path = f"/api/ai/jobs/{job_id}/events"
            async with fast.http.stream("GET", path, headers=fast.as_user()) as r:
                async for item in events_of(r):
                    if isinstance(item, Event):
                        got.append(item)
                    else:
                        comments.append(item)

        reader = asyncio.create_task(read())
        await wait_for(lambda: hub(fast).connects == 1 and len(comments) >= 2)
        await hub(fast).drop_connection_for_tests()
        await wait_for(lambda: hub(fast).connects == 2)
        await asyncio.wait_for(reader, 60)
        states = [e.data["lifecycleStatus"] for e in got]
        assert states[0] in ("queued", "running") and states[-1] == "succeeded", states


async def test_the_all_jobs_stream_resumes_with_last_event_id(api: Api) -> None:
    first = await api.create_id()
    second = await api.create_id()
    await api.create_id("bob")
    events, closed = await collect(
        api,
        "/api/ai/jobs/events",
        {**api.as_user(), "Last-Event-ID": "0"},
        until=lambda ev: len(ev) >= 2,
    )
    assert not closed
    assert {e.data["jobId"] for e in events} == {first, second}
    assert all(e.data["lifecycleStatus"] == "queued" for e in events)
    await wait_for(lambda: hub(api).subscriber_count == 0)


# ---- bounded streams -----------------------------------------------------------------------

ALL_JOBS = "/api/ai/jobs/events"


def slots(api: Api) -> StreamSlots:
    found = hub(api).slots
    assert found is not None, "no stream has taken a slot yet"
    return found


async def test_a_users_streams_are_capped_and_a_closed_stream_frees_its_slot(
    db: Any, env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events_route, "MAX_STREAMS_PER_USER", 2)
    async with start_api(env()) as capped:
        job_id = await capped.create_id()
        job_path = f"/api/ai/jobs/{job_id}/events"
        async with contextlib.AsyncExitStack() as held:
            for path in (ALL_JOBS, job_path):
                r = await held.enter_async_context(
                    capped.http.stream("GET", path, headers=capped.as_user())
                )
                assert r.status_code == 200
            assert slots(capped).held_by("alice") == 2
            # The third of alice's streams, on either route, is refused...
            for path in (ALL_JOBS, job_path):
                refused = await capped.http.get(path, headers=capped.as_user())
                assert_problem(refused, 429, "TOO_MANY_STREAMS")
                assert refused.headers["Retry-After"] == str(STREAM_RETRY_AFTER_S)
            # ...while another user still gets one.
            async with capped.http.stream("GET", ALL_JOBS, headers=capped.as_user("bob")) as b:
                assert b.status_code == 200
                assert slots(capped).held_by("bob") == 1
        # Both clients went away: their slots are free, and alice may open streams again.
        await wait_for(lambda: slots(capped).open == 0)
        async with capped.http.stream("GET", ALL_JOBS, headers=capped.as_user()) as r:
            assert r.status_code == 200
            assert slots(capped).held_by("alice") == 1


async def test_a_stream_that_ends_frees_its_slot(
    db: Any, env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job stream ends after the terminal state; its slot goes back with it."""
    monkeypatch.setattr(events_route, "MAX_STREAMS_PER_USER", 1)
    async with start_api(env()) as capped:
        job_id = await capped.create_id()
        assert (await capped.cancel(job_id)).status_code == 200
        path = f"/api/ai/jobs/{job_id}/events"
        for _ in range(3):  # one slot, reused: each stream ends on its own
            events, closed = await collect(capped, path, capped.as_user(), until=lambda _: False)
            assert closed and [e.data["lifecycleStatus"] for e in events] == ["cancelled"]
            await wait_for(lambda: slots(capped).open == 0)


async def test_the_process_cap_holds_across_users(
    db: Any, env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events_route, "MAX_STREAMS", 2)
    async with start_api(env()) as capped, contextlib.AsyncExitStack() as held:
        for user in ("alice", "bob"):
            r = await held.enter_async_context(
                capped.http.stream("GET", ALL_JOBS, headers=capped.as_user(user))
            )
            assert r.status_code == 200
        refused = await capped.http.get(ALL_JOBS, headers=capped.as_user("carol"))
        assert_problem(refused, 429, "TOO_MANY_STREAMS")
        assert refused.headers["Retry-After"] == str(STREAM_RETRY_AFTER_S)


async def test_server_shutdown_frees_the_slots(db: Any, env: Any) -> None:
    opened = asyncio.Event()

    async def hold(api: Api) -> None:
        with contextlib.suppress(httpx.HTTPError):
            async with api.http.stream("GET", ALL_JOBS, headers=api.as_user()) as r:
                assert r.status_code == 200
                opened.set()
                async for _ in r.aiter_lines():
                    pass

    async with start_api(env()) as server:
        reader = asyncio.create_task(hold(server))
        await asyncio.wait_for(opened.wait(), 10)
        held = slots(server)
        assert held.open == 1
    # The server stopped with the stream open: the stream ended and gave its slot back.
    await asyncio.wait_for(reader, 10)
    assert held.open == 0


async def test_the_resume_query_uses_its_index(db: Any) -> None:
    """`jobs.changed_since` (the all-jobs stream's resume) reads the (user_id,
    updated_at) index in order, instead of all of a user's jobs sorted."""
    async with db.begin() as s:
        await s.execute(
            text(
                """
                INSERT INTO ai_job (id, user_id, job_type, target_type, target_id,
                    request_fingerprint, lifecycle_status, status, queue_name, priority, input,
                    credential_mode, prompt_version, input_schema_version,
                    output_schema_version, max_retry_count, workflow_id, created_at, updated_at)
                SELECT gen_random_uuid(), 'u' || (i % 50), 'synthetic', 't', 't', 'f',
                    'queued', 'pending', 'ai-interactive', 50, '{}'::jsonb,
                    'platform_key', 'v1', 'v1', 'v1', 0, 'w' || i,
                    now() - i * interval '1 minute', now() - i * interval '1 minute'
                FROM generate_series(1, 20000) AS i
                """
            )
        )
        await s.execute(text("ANALYZE ai_job"))
        plan = "\n".join(
            r[0]
            for r in await s.execute(
                text(
                    "EXPLAIN SELECT id FROM ai_job WHERE user_id = :u "
                    "AND updated_at > to_timestamp(:since / 1000000.0) "
                    "ORDER BY updated_at LIMIT :lim"
                ),
                {"u": "u7", "since": 0, "lim": 100},
            )
        )
        found = await jobs_db.changed_since(s, "u7", 0, limit=100)
        await s.rollback()
    assert "ix_ai_job_user_updated" in plan, plan
    assert "Sort" not in plan, plan
    assert len(found) == 100


async def test_the_openapi_document_declares_the_refusal(api: Api) -> None:
    doc = (await api.http.get("/openapi.json")).json()
    for path in (ALL_JOBS, "/api/ai/jobs/{jobId}/events"):
        refusal = doc["paths"][path]["get"]["responses"]["429"]
        assert "TOO_MANY_STREAMS" in refusal["description"]
        assert "Retry-After" in refusal["headers"]
        assert refusal["content"]["application/problem+json"]["schema"] == {
            "$ref": "#/components/schemas/Problem"
        }
