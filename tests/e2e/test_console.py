"""The operator console's sign-in, sessions and actions, in a real browser (Debian's chromium
through Playwright) and over plain HTTP, on the shared e2e server.

- The form signs an admin in (the field labelled "Admin token", then Enter): 303 to the jobs
  page with a cookie `Path=/console; HttpOnly; SameSite=Strict` (not `Secure` over http); the
  session lives in PostgreSQL under the hash of its id; signing out ends it for a copied cookie
  too. Without a session every page is 303 to the form.
- A valid token without SUPER_ADMIN is 403, an invalid or expired one 401, neither creates a
  session; a bearer header is no session, and the cookie opens no JSON route.
- A delayed (queued) job is cancelled by one click on its page's "Cancel job": the API reads it
  cancelled and the audit log has the admin's `job.cancel`. Before that, the session cookie
  copied into another client reads the page, but its POSTs without the CSRF token are 403 and
  change nothing.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta

import httpx
from playwright.async_api import Browser
from sqlalchemy import text

from api.console.sessions import COOKIE
from db.session import SessionMaker
from tests.e2e.conftest import Api
from tests.e2e.console_helpers import sign_in, tab

ADMIN = "root"
_CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


async def login(api: Api, token: str, **headers: str) -> httpx.Response:
    """A sign-in POST from a client of its own (the shared client must keep no cookie)."""
    async with httpx.AsyncClient(base_url=api.base_url) as c:
        return await c.post("/console/login", data={"token": token}, headers=headers)


async def session_rows(db: SessionMaker) -> list[tuple[str, str]]:
    async with db.begin() as s:
        rows = await s.execute(text("SELECT id_hash, user_id FROM console_session"))
        return [(r.id_hash, r.user_id) for r in rows]


async def test_the_form_signs_an_admin_in_with_a_strict_cookie(
    api: Api, db: SessionMaker, browser: Browser
) -> None:
    async with tab(browser, api.base_url) as (context, page, _):
        r = await page.goto("/console")
        assert r is not None and page.url.endswith("/console/login"), page.url
        await sign_in(page, api.token(ADMIN, admin=True))
        assert await page.locator("h1").inner_text() == "Jobs"
        (cookie,) = [c for c in await context.cookies() if c["name"] == COOKIE]
        assert cookie["path"] == "/console"
        assert cookie["httpOnly"] is True
        assert cookie["sameSite"] == "Strict"
        assert cookie["secure"] is False  # the scheme uvicorn saw is http
        # A session lasts at most CONSOLE_SESSION_TTL_S (8 h by default).
        assert 0 < cookie["expires"] - datetime.now(UTC).timestamp() <= 8 * 3600 + 5
        # The table holds the hash of the id, never the id.
        first = cookie["value"]
        assert await session_rows(db) == [(hashlib.sha256(first.encode()).hexdigest(), ADMIN)]
        # Signing in again replaces the browser's session: a fresh id, the old one ended.
        await sign_in(page, api.token(ADMIN, admin=True))
        (cookie,) = [c for c in await context.cookies() if c["name"] == COOKIE]
        sid = cookie["value"]
        assert sid != first
        assert await session_rows(db) == [(hashlib.sha256(sid.encode()).hexdigest(), ADMIN)]

        # Signing out ends the session for every holder of the cookie.
        async with httpx.AsyncClient(base_url=api.base_url, cookies={COOKIE: sid}) as copy:
            assert (await copy.get("/console/jobs")).status_code == 200
            await page.get_by_role("button", name="Sign out").click()
            await page.wait_for_url("**/console/login")
            assert await session_rows(db) == []
            r2 = await copy.get("/console/jobs")
            assert r2.status_code == 303 and r2.headers["location"] == "/console/login"


async def test_a_session_never_outlives_the_token(api: Api, db: SessionMaker) -> None:
    token = api.token(ADMIN, admin=True, ttl_s=120)
    r = await login(api, token)
    assert r.status_code == 303, r.text
    set_cookie = r.headers["set-cookie"]
    age = int(re.search(r"Max-Age=(\d+)", set_cookie, re.IGNORECASE).group(1))  # type: ignore[union-attr]
    assert 100 <= age <= 120, set_cookie
    for flag in ("HttpOnly", "Path=/console", "SameSite=strict"):
        assert flag.lower() in set_cookie.lower(), set_cookie
    assert "secure" not in set_cookie.lower()
    async with db.begin() as s:
        left = await s.scalar(text("SELECT expires_at - now() FROM console_session"))
    assert timedelta(seconds=90) < left <= timedelta(seconds=120)
    # Behind a TLS proxy uvicorn trusts (its proxy headers, from 127.0.0.1 by default) the
    # scheme is https, and the cookie is Secure.
    r = await login(api, token, **{"X-Forwarded-Proto": "https"})
    assert r.status_code == 303 and "; secure" in r.headers["set-cookie"].lower()


async def test_refused_tokens_and_bearer_headers_open_nothing(api: Api, db: SessionMaker) -> None:
    cases = {
        api.token("alice"): 403,  # valid, without SUPER_ADMIN
        api.token(ADMIN, admin=True, ttl_s=-60): 401,  # expired
        "not-a-token": 401,
        "": 401,
    }
    for token, status in cases.items():
        r = await login(api, token)
        assert r.status_code == status, (token, r.status_code)
        assert "set-cookie" not in r.headers
        assert 'for="token"' in r.text and "Admin token" in r.text  # the form again
        assert r.headers["content-type"].startswith("text/html")
    assert "admin token is needed" in (await login(api, api.token("alice"))).text
    assert await session_rows(db) == []

    # The console is no part of the JSON API: not in its document, and its headers stay its own.
    paths = (await api.http.get("/openapi.json")).json()["paths"]
    assert not [p for p in paths if p.startswith("/console")]
    docs = await api.http.get("/docs")
    assert docs.status_code == 200 and "content-security-policy" not in docs.headers
    login_page = await api.http.get("/console/login")
    assert "'unsafe-inline'" not in login_page.headers["content-security-policy"]
    assert login_page.headers["cache-control"] == "no-store"

    # A bearer header is no console session; the console's cookie opens no JSON route.
    r = await api.http.get("/console/jobs", headers=api.as_admin())
    assert r.status_code == 303 and r.headers["location"] == "/console/login"
    sid = (await login(api, api.token(ADMIN, admin=True))).cookies[COOKIE]
    async with httpx.AsyncClient(base_url=api.base_url, cookies={COOKIE: sid}) as c:
        assert (await c.get("/admin-api/ai/jobs")).status_code == 401
    # A sign-in posted from another site is refused.
    r = await login(api, api.token(ADMIN, admin=True), **{"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403 and "set-cookie" not in r.headers


async def test_a_click_cancels_a_queued_job_and_csrf_guards_every_post(
    api: Api, db: SessionMaker, browser: Browser
) -> None:
    run_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    job_id = await api.create_id(runAt=run_at)
    page_path = f"/console/jobs/{job_id}"
    async with tab(browser, api.base_url) as (context, page, _):
        await sign_in(page, api.token(ADMIN, admin=True))
        (cookie,) = [c for c in await context.cookies() if c["name"] == COOKIE]

        # The cookie copied into another client reads the page...
        async with httpx.AsyncClient(
            base_url=api.base_url, cookies={COOKIE: cookie["value"]}
        ) as copy:
            r = await copy.get(page_path)
            assert r.status_code == 200 and "Cancel job" in r.text
            csrf = _CSRF.search(r.text).group(1)  # type: ignore[union-attr]
            cancel = f"{page_path}/cancel"
            # ...but no POST without the session's CSRF token changes anything.
            refused = [
                await copy.post(cancel, data={}),
                await copy.post(cancel, data={"csrf": "0" * len(csrf)}),
                await copy.post(cancel, json={"csrf": csrf}),
                await copy.post(cancel, data={"csrf": csrf}, headers={"X-CSRF-Token": "x"}),
                await copy.post("/console/logout", data={}),
                await copy.post("/console/bulk", data={"action": "cancel", "step": "confirm"}),
            ]
            assert [x.status_code for x in refused] == [403] * len(refused)
            # Without a cookie the token alone is nothing either.
            async with httpx.AsyncClient(base_url=api.base_url) as bare:
                assert (await bare.post(cancel, data={"csrf": csrf})).status_code == 403
        assert (await api.get(job_id))["lifecycleStatus"] == "queued"
        assert len(await session_rows(db)) == 1

        await page.goto(page_path)
        await page.get_by_role("button", name="Cancel job").click()
        await page.wait_for_url(f"**{page_path}?done=cancelled")
        assert "The job is cancelled." in await page.locator("main").inner_text()
    assert (await api.get(job_id))["lifecycleStatus"] == "cancelled"

    r = await api.http.get("/admin-api/ai/audit", headers=api.as_admin("auditor"))
    entries = [(e["actor"], e["action"], e["targetId"], e["outcome"]) for e in r.json()["items"]]
    assert (ADMIN, "job.cancel", job_id, "cancelled") in entries
    assert (ADMIN, "job.view", job_id, "ok") in entries
    # A cancelled job offers a retry: one click, the admin retry's audit entry.
    async with tab(browser, api.base_url) as (_, page, _):
        await sign_in(page, api.token(ADMIN, admin=True))
        await page.goto(page_path)
        assert await page.get_by_role("button", name="Cancel job").count() == 0
        await page.get_by_role("button", name="Retry job").click()
        await page.wait_for_url("**?done=retried")
        retry_id = page.url.split("/console/jobs/")[1].split("?")[0]
    assert retry_id != job_id
    r = await api.http.get(f"/admin-api/ai/jobs/{retry_id}", headers=api.as_admin())
    assert r.json()["retriedFromJobId"] == job_id


async def test_a_refused_action_is_shown_with_its_code(api: Api, browser: Browser) -> None:
    job_id = await api.create_id()
    assert (await api.cancel(job_id)).status_code == 200
    sid = (await login(api, api.token(ADMIN, admin=True))).cookies[COOKIE]
    async with httpx.AsyncClient(base_url=api.base_url, cookies={COOKIE: sid}) as c:
        page = await c.get(f"/console/jobs/{job_id}")
        csrf = _CSRF.search(page.text).group(1)  # type: ignore[union-attr]
        r = await c.post(f"/console/jobs/{job_id}/cancel", data={"csrf": csrf})
        assert r.status_code == 409 and "JOB_ALREADY_CANCELLED" in r.text
        assert r.headers["content-type"].startswith("text/html")
        r = await c.get("/console/jobs/not-a-uuid")
        assert r.status_code == 404 and "JOB_NOT_FOUND" in r.text
        r = await c.get("/console/nowhere")
        assert r.status_code == 404 and "<h1>" in r.text
        # Outside the JSON API's strictness: unknown parameters are ignored, not 422.
        r = await c.get("/console/jobs", params={"utm_source": "mail"})
        assert r.status_code == 200
