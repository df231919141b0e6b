"""The operator console's pages in a real browser (Debian's chromium through Playwright), on the
shared e2e server: what each page shows is what the admin API answers.

- The jobs page is the admin list: `?userId=` lists a user's jobs as rows linking to their
  pages, `&jobType=` only those of that type; the admin list and the bulk API take the same
  filters (target, metadata, errorCode). Bulk actions: a dry run first, then the operation on
  the same filter and its progress; a filter over ADMIN_BULK_MAX_JOBS shows BULK_TOO_LARGE
  with its count and limit.
- A finished job's page has one row per provider call with the usage API's model, tokens, cost
  and cost basis, its artifacts and the admin view's Temporal UI link.
- Every page answers 200 with a CSP that allows no inline script, one <h1>, a <nav> and a
  <main>, requests nothing but 127.0.0.1, and does not scroll sideways at a 390 px phone width;
  the spend page draws its chart as an inline <svg> in <main> and shows the usage API's total.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from playwright.async_api import Browser, Page
from sqlalchemy import text

from db import schedules as schedules_db
from db import usage as usage_db
from db.session import SessionMaker
from db.usage import UsageRow
from tests.e2e.conftest import Api, start_api
from tests.e2e.console_helpers import PHONE, off_host, script_policy, sign_in, tab
from tests.job_data import INPUTS
from tests.stack import Stack

ADMIN = "root"
CARDS = "flashcard_generation"


async def linked_jobs(page: Page) -> list[str]:
    hrefs = await page.locator("main table tbody tr td:first-child a").evaluate_all(
        "links => links.map(a => a.getAttribute('href'))"
    )
    return [h.rsplit("/", 1)[1] for h in hrefs]


async def admin_ids(api: Api, **params: str) -> list[str]:
    r = await api.http.get("/admin-api/ai/jobs", params=params, headers=api.as_admin())
    assert r.status_code == 200, r.text
    return [item["jobId"] for item in r.json()["items"]]


async def test_the_jobs_page_filters_as_the_admin_list_does(
    api: Api, db: SessionMaker, browser: Browser
) -> None:
    a1 = await api.create_id("alice", metadata={"courseId": "C42"})
    a2 = await api.create_id("alice", input=INPUTS[CARDS], jobType=CARDS, targetId="t-2")
    a3 = await api.create_id("alice")
    await api.create_id("bob", metadata={"courseId": "C42"})
    async with db.begin() as s:
        await s.execute(
            text("UPDATE ai_job SET error_code = 'PROVIDER_UNAVAILABLE' WHERE id = :id"),
            {"id": a3},
        )
    # The admin list takes the new filters...
    assert await admin_ids(api, targetType="lesson", targetId="t-2") == [a2]
    assert await admin_ids(api, **{"metadata.courseId": "C42", "userId": "alice"}) == [a1]
    assert await admin_ids(api, errorCode="PROVIDER_UNAVAILABLE") == [a3]
    r = await api.http.get(
        "/admin-api/ai/jobs", params={"errorCode": "bad"}, headers=api.as_admin()
    )
    assert r.status_code == 422
    # ...and so does the bulk API's dry run.
    r = await api.http.post(
        "/admin-api/ai/bulk/cancel",
        json={"dryRun": True, "targetId": "t-2", "metadata": {}},
        headers=api.as_admin(),
    )
    assert r.json()["matched"] == 1 and r.json()["sample"] == [a2], r.text
    r = await api.http.post(
        "/admin-api/ai/bulk/cancel",
        json={"dryRun": True, "metadata": {"courseId": "C42"}},
        headers=api.as_admin(),
    )
    assert r.json()["matched"] == 2, r.text

    async with tab(browser, api.base_url) as (_, page, _):
        await sign_in(page, api.token(ADMIN, admin=True))
        await page.goto("/console/jobs?userId=alice")
        assert await linked_jobs(page) == [a3, a2, a1]  # newest first
        await page.goto("/console/jobs?userId=alice&jobType=synthetic")
        assert await linked_jobs(page) == [a3, a1]
        # The form's fields are the query parameters: a filtered view is a link.
        await page.goto("/console/jobs")
        await page.get_by_label("userId").fill("alice")
        await page.get_by_label("jobType").fill(CARDS)
        await page.get_by_role("button", name="Filter").click()
        await page.wait_for_url("**/console/jobs?*jobType=flashcard_generation*")
        assert await linked_jobs(page) == [a2]
        await page.goto("/console/jobs?metadata.courseId=C42&userId=alice")
        assert await linked_jobs(page) == [a1]
        assert await page.get_by_label("metadata.courseId").input_value() == "C42"
        # Paging: a "Next" link continues the same filter.
        await page.goto("/console/jobs?userId=alice&limit=2")
        assert await linked_jobs(page) == [a3, a2]
        await page.get_by_role("link", name="Next").click()
        assert await linked_jobs(page) == [a1]

        # Bulk cancel of exactly this filter: the dry run, then the operation.
        await page.goto("/console/jobs?userId=alice&jobType=synthetic")
        await page.get_by_role("button", name="Bulk cancel (dry run)").click()
        main = await page.locator("main").inner_text()
        assert "2 jobs match." in main, main
        await page.get_by_role("button", name="Cancel these 2 jobs").click()
        await page.wait_for_url("**/console/bulk/*")
        assert "Bulk operation" in await page.locator("h1").inner_text()
    r = await api.http.get("/admin-api/ai/audit", headers=api.as_admin("auditor"))
    actions = {(e["actor"], e["action"], e["outcome"]) for e in r.json()["items"]}
    assert {(ADMIN, "job.list", "ok"), (ADMIN, "bulk.cancel", "dry_run")} <= actions
    assert (ADMIN, "bulk.cancel", "accepted") in actions


async def test_bulk_too_large_is_shown_with_its_count_and_limit(
    db: SessionMaker, env: Any, browser: Browser
) -> None:
    async with start_api(env(ADMIN_BULK_MAX_JOBS=1)) as api:
        for _ in range(2):
            await api.create_id("carol")
        async with tab(browser, api.base_url) as (_, page, _):
            await sign_in(page, api.token(ADMIN, admin=True))
            await page.goto("/console/jobs?userId=carol")
            await page.get_by_role("button", name="Bulk retry (dry run)").click()
            main = await page.locator("main").inner_text()
            assert "BULK_TOO_LARGE" in main and "2 jobs match; the limit is 1" in main, main
            assert await page.get_by_role("button", name="Retry these 2 jobs").count() == 0


async def add_page_data(api: Api, db: SessionMaker, finished: str) -> dict[str, str]:
    """A priced call on the finished job, a parked outbox row, a schedule with a refused run."""
    async with db.begin() as s:
        await usage_db.insert(
            s,
            UsageRow(
                uuid.UUID(finished),
                "alice",
                "synthetic",
                1,
                "platform_key",
                "p",
                "m-priced",
                1000,
                250,
                Decimal("0.00137000"),
                5,
                "PROVIDER_TIMEOUT",
                cost_basis="estimated",
            ),
        )
    queued = await api.create_id("alice")
    async with db.begin() as s:
        await s.execute(
            text(
                "UPDATE outbox_event SET status = 'dead', attempt_count = 3 WHERE aggregate_id = :a"
            ),
            {"a": queued},
        )
    body = {"jobType": "synthetic", "input": {}, "intervalSeconds": 3600, "paused": True}
    r = await api.http.post("/api/ai/schedules", json=body, headers=api.as_user("dora"))
    assert r.status_code == 201, r.text
    sid = r.json()["scheduleId"]
    async with db.begin() as s:
        await schedules_db.record_run(
            s,
            uuid.UUID(sid),
            datetime.now(UTC),
            job_id=None,
            error_code="QUOTA_EXCEEDED",
            manual=False,
        )
    return {"queued": queued, "schedule": sid}


async def provider_call_rows(page: Page) -> list[list[str]]:
    rows = page.locator("table.calls tbody tr")
    return [
        [c.strip() for c in await rows.nth(i).locator("td").all_inner_texts()]
        for i in range(await rows.count())
    ]


async def check_page(page: Page, path: str, requested: list[str], *, phone: bool) -> None:
    r = await page.goto(path)
    assert r is not None and r.status == 200, (path, r and r.status)
    csp = r.headers["content-security-policy"]
    policy = script_policy(csp)
    assert policy and "'unsafe-inline'" not in policy, csp
    assert r.headers["cache-control"] == "no-store"
    assert await page.locator("h1").count() == 1, path
    assert await page.locator("nav").count() >= 1 and await page.locator("main").count() == 1
    assert off_host(requested) == [], off_host(requested)
    if phone:
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE["width"], (path, width)


async def test_every_page_is_whole_small_and_local(
    api: Api, db: SessionMaker, workers: Stack, browser: Browser
) -> None:
    finished = await api.create_id("alice", metadata={"courseId": "C42"})
    await api.wait_status(finished, "succeeded")
    extra = await add_page_data(api, db, finished)
    admin_view = await api.admin_get(finished)
    r = await api.http.get(f"/api/ai/jobs/{finished}/usage", headers=api.as_admin())
    calls = [
        [
            str(a["attempt"]),
            c["model"],
            str(c["tokensIn"]),
            str(c["tokensOut"]),
            c["costUsd"],
            c["costBasis"],
        ]
        for a in r.json()["attempts"]
        for c in a["providerCalls"]
    ]
    assert len(calls) == 2 and ["1", "m-priced", "1000", "250", "0.00137000", "estimated"] in calls
    r = await api.http.get("/admin-api/ai/usage", headers=api.as_admin())
    total = r.json()["total"]["costUsd"]
    assert Decimal(total) > 0

    pages = ["/console/jobs", "/console/outbox", "/console/schedules", "/console/spend"]
    job_pages = [f"/console/jobs/{finished}", f"/console/jobs/{extra['queued']}"]
    async with tab(browser, api.base_url) as (_, page, requested):
        await sign_in(page, api.token(ADMIN, admin=True))
        for path in [*pages, *job_pages]:
            await check_page(page, path, requested, phone=False)

        await page.goto(job_pages[0])
        rows = await provider_call_rows(page)
        # Attempt, model, pricedAs, tokensIn, tokensOut, costUsd, costBasis, serviceTier.
        assert sorted([r[0], r[1], r[3], r[4], r[5], r[6]] for r in rows) == sorted(calls)
        artifacts = await page.locator("section", has_text="Artifacts").inner_text()
        assert "synthetic_result" in artifacts.lower()
        link = page.get_by_role("link", name=admin_view["workflowId"])
        assert await link.get_attribute("href") == admin_view["temporalUiUrl"]

        await page.goto("/console/spend")
        assert await page.locator("main svg").count() == 1
        assert await page.locator("main svg rect").count() >= 30
        assert total in await page.locator("main").inner_text()

        await page.goto("/console/outbox")
        assert extra["queued"] in await page.locator("main table").inner_text()
        await page.get_by_role("button", name="Requeue").click()
        await page.wait_for_url("**/console/outbox?done=requeued")

        await page.goto("/console/schedules")
        table = await page.locator("main table").inner_text()
        assert "dora" in table and "QUOTA_EXCEEDED" in table and "3600 s" in table
        await page.get_by_role("button", name="Resume").click()
        await page.wait_for_url("**/console/schedules?done=resumed")
        assert await page.get_by_role("button", name="Pause").count() == 1

    async with tab(browser, api.base_url, PHONE) as (_, page, requested):
        await sign_in(page, api.token(ADMIN, admin=True))
        for path in [*job_pages, *pages, "/console/login"]:
            await check_page(page, path, requested, phone=True)
