"""Browsers as clients over real HTTP: CORS for CORS_ALLOW_ORIGINS (preflight 204), and stream
tokens for an EventSource (`?streamToken=`): used, expired, misused, never logged."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from typing import Any

import jwt
import pytest

from api import browser
from api.auth import JwtConfig
from tests.e2e.conftest import Api, assert_problem, start_api
from tests.sse import Event, events_of

ORIGIN = "https://app.example.com"


async def stream_token(api: Api, user: str = "alice") -> str:
    r = await api.http.post("/api/ai/stream-tokens", headers=api.as_user(user))
    assert r.status_code == 201, r.text
    body = r.json()
    expires = dt.datetime.fromisoformat(body["expiresAt"])
    left = (expires - dt.datetime.now(dt.UTC)).total_seconds()
    assert 0 < left <= 300, body
    token: str = body["token"]
    return token


async def first_event(api: Api, path: str, **params: Any) -> Event:
    async with asyncio.timeout(20):
        async with api.http.stream("GET", path, params=params) as r:
            assert r.status_code == 200, await r.aread()
            async for item in events_of(r):
                if isinstance(item, Event):
                    return item
    raise AssertionError("no event")


async def test_cors_preflight_and_answers(env: Any) -> None:
    async with start_api(env(CORS_ALLOW_ORIGINS=f"{ORIGIN}, https://other.example")) as api:
        pre = await api.http.options(
            "/api/ai/jobs",
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert pre.status_code == 204, pre.text
        assert pre.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in pre.headers["access-control-allow-methods"]
        allowed = pre.headers["access-control-allow-headers"].lower()
        assert "authorization" in allowed and "content-type" in allowed
        r = await api.http.get("/api/ai/jobs", headers={"Origin": ORIGIN, **api.as_user()})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == ORIGIN
        # A refusal is readable by the page too.
        r = await api.http.get("/api/ai/jobs", headers={"Origin": ORIGIN})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ORIGIN
        evil = await api.http.options(
            "/api/ai/jobs",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"},
        )
        assert "access-control-allow-origin" not in evil.headers


async def test_no_cors_by_default(api: Api) -> None:
    r = await api.http.get("/api/ai/jobs", headers={"Origin": ORIGIN, **api.as_user()})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


async def test_a_stream_token_follows_ones_own_jobs(api: Api) -> None:
    job_id = await api.create_id()
    token = await stream_token(api)
    ev = await first_event(api, f"/api/ai/jobs/{job_id}/events", streamToken=token)
    assert ev.data["jobId"] == job_id and ev.data["lifecycleStatus"] == "queued"
    async with asyncio.timeout(20):
        async with api.http.stream(
            "GET", "/api/ai/jobs/events", params={"streamToken": token}
        ) as r:
            assert r.status_code == 200


async def test_a_stream_token_is_refused_when_misused(api: Api) -> None:
    job_id = await api.create_id()
    bobs = await api.create_id("bob")
    token = await stream_token(api)
    # As a bearer token, anywhere.
    for path in ("/api/ai/jobs", f"/api/ai/jobs/{job_id}", f"/api/ai/jobs/{job_id}/events"):
        r = await api.http.get(path, headers={"Authorization": f"Bearer {token}"})
        assert_problem(r, 401, "UNAUTHENTICATED")
    # In the query string of another route.
    r = await api.http.get("/api/ai/jobs", params={"streamToken": token})
    assert_problem(r, 401, "UNAUTHENTICATED")
    # For another user's job.
    r = await api.http.get(f"/api/ai/jobs/{bobs}/events", params={"streamToken": token})
    assert_problem(r, 401, "UNAUTHENTICATED")
    # A bearer token is not a stream token.
    bearer = api.token("alice")
    r = await api.http.get(f"/api/ai/jobs/{job_id}/events", params={"streamToken": bearer})
    assert_problem(r, 401, "UNAUTHENTICATED")
    # Forged with the right shape but another secret.
    other = JwtConfig(secret="not-the-server-secret-" + "x" * 16)
    forged, _ = browser.issue_stream_token(other, "alice")
    r = await api.http.get(f"/api/ai/jobs/{job_id}/events", params={"streamToken": forged})
    assert_problem(r, 401, "UNAUTHENTICATED")
    # Creating one needs a bearer token.
    assert_problem(await api.http.post("/api/ai/stream-tokens"), 401, "UNAUTHENTICATED")


async def test_an_expired_or_too_long_stream_token_is_refused(api: Api) -> None:
    job_id = await api.create_id()
    cfg = JwtConfig.from_settings(api.settings)
    key = browser._key(cfg)
    now = int(time.time())
    base = {"sub": "alice", "aud": browser.STREAM_AUDIENCE, "typ": browser.STREAM_TYP}
    expired = jwt.encode({**base, "iat": now - 400, "exp": now - 100}, key, algorithm="HS256")
    too_long = jwt.encode({**base, "iat": now, "exp": now + 3600}, key, algorithm="HS256")
    valid = jwt.encode({**base, "iat": now, "exp": now + 60}, key, algorithm="HS256")
    for token in (expired, too_long):
        r = await api.http.get(f"/api/ai/jobs/{job_id}/events", params={"streamToken": token})
        assert_problem(r, 401, "UNAUTHENTICATED")
    ev = await first_event(api, f"/api/ai/jobs/{job_id}/events", streamToken=valid)
    assert ev.data["jobId"] == job_id


def test_the_access_log_redacts_the_token(caplog: pytest.LogCaptureFixture) -> None:
    browser.redact_access_log()
    log = logging.getLogger("uvicorn.access")
    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        log.info(
            '%s - "%s %s HTTP/%s" %d',
            "127.0.0.1:5000",
            "GET",
            "/api/ai/jobs/events?streamToken=abc.def.ghi&x=1",
            "1.1",
            200,
        )
    assert "abc.def.ghi" not in caplog.text
    assert "streamToken=[redacted]&x=1" in caplog.text
