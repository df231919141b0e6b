"""The usage API on the real app and PostgreSQL: what users and admins read of AI spend.

- Real jobs on the fake OpenAI-compatible server (one with a failed first attempt): each job's
  usage equals its log rows and `ai_job.spent_cost_usd`, and the range endpoints' sums equal the
  jobs' figures.
- Owner isolation: a user's own range never includes another's calls, and another user's job
  usage is the same 404 as a missing job.
- Admin grouping by every value, filters, date validation and the default range.
- The rollup under concurrent EXECUTE-like inserts on separate connections equals a GROUP BY
  over the log (no lost update), and every job's spend equals its rows' sum.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from temporalio.client import Client

from bench.usage import run_on
from db import usage as usage_db
from db.session import SessionMaker
from db.usage import UsageRow
from engine.settings import Settings
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import api_client, auth, fake_env
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, Stack, engine_stack, make_settings

JOB_TYPE = "flashcard_generation"
USD = re.compile(r"^\d+\.\d{8}$")


def _today() -> date:
    """The UTC day now: read when a test asserts, not at import (a run crossing midnight)."""
    return datetime.now(UTC).date()


# ---- helpers ------------------------------------------------------------------------------


async def _get(
    c: httpx.AsyncClient, settings: Settings, path: str, user: str, *, admin: bool = False
) -> Any:
    r = await c.get(path, headers=auth(settings, user, admin=admin))
    assert r.status_code == 200, r.text
    return r.json()


async def _log_sums(db: SessionMaker, where: str, params: dict[str, Any]) -> tuple[int, ...]:
    async with db() as s:
        r = (
            await s.execute(
                text(
                    "SELECT count(*), coalesce(sum(tokens_in), 0), coalesce(sum(tokens_out), 0), "
                    f"coalesce(sum(cost_usd), 0) FROM ai_usage_log WHERE {where}"
                ),
                params,
            )
        ).one()
    return int(r[0]), int(r[1]), int(r[2]), r[3]


def _sums(body: dict[str, Any]) -> tuple[Any, ...]:
    return body["calls"], body["tokensIn"], body["tokensOut"], Decimal(body["costUsd"])


async def _run(stack: Stack, user: str) -> uuid.UUID:
    job_id = await stack.create(
        user_id=user,
        job_type=JOB_TYPE,
        target_type="lesson",
        target_id="L-1",
        input=INPUTS[JOB_TYPE],
    )
    row = await stack.wait_status(job_id, "succeeded", "failed", timeout=60)
    assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
    return job_id


@pytest.fixture
async def idle_stack(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> AsyncIterator[Stack]:
    """The job service without workers or relay: jobs stay queued, usage rows are written
    through the repository as EXECUTE writes them."""
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as s:
        yield s


async def _insert(
    db: SessionMaker,
    job_id: uuid.UUID,
    user: str,
    *,
    job_type: str = "synthetic",
    model: str = "m-a",
    mode: str = "platform_key",
    tokens: tuple[int, int] = (10, 5),
    cost: str = "0.00000123",
    attempt: int = 1,
    error: str | None = None,
) -> None:
    async with db.begin() as s:
        await usage_db.insert(
            s,
            UsageRow(
                job_id=job_id,
                user_id=user,
                job_type=job_type,
                attempt_no=attempt,
                credential_mode=mode,
                provider="p",
                model=model,
                tokens_in=tokens[0],
                tokens_out=tokens[1],
                cost_usd=Decimal(cost),
                latency_ms=1,
                error_code=error,
            ),
        )


# ---- real jobs ------------------------------------------------------------------------------


async def test_usage_endpoints_sum_to_the_jobs_figures_and_stay_with_their_owner(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    valid = {"kind": "valid", "content": SCRIPTED[JOB_TYPE], "tokens_in": 1200, "tokens_out": 800}
    await fake.ascript([{"kind": "status", "status": 500}], default=valid)
    settings = make_settings(
        database_url, temporal_address, **fake_env(fake, AI_MODEL="gpt-4o-mini")
    )
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        retried = await _run(stack, "alice")  # its first call answers 500
        plain = await _run(stack, "alice")
        bobs = await _run(stack, "bob")

    async with api_client(settings) as (_, c):
        job = await _get(c, settings, f"/api/ai/jobs/{retried}/usage", "alice")
        assert [a["attempt"] for a in job["attempts"]] == [1, 2]
        first, second = job["attempts"]
        assert first["calls"] == 1 and first["errorCodes"] and second["errorCodes"] == []
        assert Decimal(second["costUsd"]) == Decimal("0.00066")  # gpt-4o-mini, 1200 in, 800 out
        assert _sums(job) == await _log_sums(db, "job_id = :j", {"j": retried})
        assert job["calls"] == 2 and Decimal(job["costUsd"]) > 0
        assert all(USD.match(x["costUsd"]) for x in [job, *job["attempts"]])
        assert USD.match(job["reservedCostUsd"])
        assert {"maxCostUsd", "estimatedInputTokens", "maxOutputTokens"} <= job.keys()
        # The admin reads the same job's usage.
        assert await _get(c, settings, f"/api/ai/jobs/{retried}/usage", "root", admin=True) == job

        per_job = {
            j: _sums(await _get(c, settings, f"/api/ai/jobs/{j}/usage", u))
            for j, u in ((retried, "alice"), (plain, "alice"), (bobs, "bob"))
        }
        async with db() as s:
            rows = (await s.execute(text("SELECT id, spent_cost_usd FROM ai_job"))).all()
        spent: dict[uuid.UUID, Decimal] = {r[0]: r[1] for r in rows}
        assert spent == {j: sums[3] for j, sums in per_job.items()}

        alice_total = tuple(map(sum, zip(per_job[retried], per_job[plain], strict=True)))
        for group in ("day", "jobType", "model"):
            own = await _get(c, settings, f"/api/ai/usage?groupBy={group}", "alice")
            assert _sums(own["total"]) == alice_total
            assert tuple(map(sum, zip(*map(_sums, own["items"]), strict=True))) == alice_total
        own = await _get(c, settings, "/api/ai/usage?groupBy=jobType", "alice")
        assert [i["key"] for i in own["items"]] == [JOB_TYPE]
        bob = await _get(c, settings, "/api/ai/usage", "bob")
        assert _sums(bob["total"]) == per_job[bobs]
        assert bob["items"][0]["key"] == _today().isoformat()

        # Someone else's job is the 404 of a missing one, body and all.
        theirs = await c.get(f"/api/ai/jobs/{retried}/usage", headers=auth(settings, "bob"))
        missing = await c.get(f"/api/ai/jobs/{uuid.uuid4()}/usage", headers=auth(settings, "bob"))
        assert theirs.status_code == missing.status_code == 404
        assert theirs.json() == missing.json()
        assert theirs.json()["code"] == "JOB_NOT_FOUND"
        # A user is refused the admin route.
        r = await c.get("/admin-api/ai/usage", headers=auth(settings, "alice"))
        assert r.status_code == 403, r.text

        by_user = await _get(c, settings, "/admin-api/ai/usage?groupBy=user", "root", admin=True)
        assert {i["key"]: _sums(i) for i in by_user["items"]} == {
            "alice": alice_total,
            "bob": per_job[bobs],
        }


# ---- admin grouping, filters and ranges -----------------------------------------------------


async def test_admin_groups_by_each_value_and_filters(
    idle_stack: Stack, db: SessionMaker, settings: Settings
) -> None:
    a = await idle_stack.create(user_id="alice")
    b = await idle_stack.create(user_id="bob")
    await _insert(db, a, "alice", model="m-a", cost="0.00000100")
    await _insert(db, a, "alice", model="m-b", cost="0.00000200", attempt=2)
    await _insert(db, a, "alice", job_type="other_type", mode="user_deepseek_key", cost="0.3")
    await _insert(db, b, "bob", model="m-b", tokens=(7, 0), cost="0", error="PROVIDER_TIMEOUT")
    # A past day, written as the rollup holds it (the log's rows are all of today).
    past = _today() - timedelta(days=10)
    async with db.begin() as s:
        await s.execute(
            text(
                "INSERT INTO ai_usage_daily VALUES (:d, 'carol', 'synthetic', 'm-a', "
                "'platform_key', 4, 40, 20, 1.5)"
            ),
            {"d": past},
        )

    expected: dict[str, dict[str, tuple[int, int, int, Decimal]]] = {
        "user": {
            "alice": (3, 30, 15, Decimal("0.300003")),
            "bob": (1, 7, 0, Decimal(0)),
            "carol": (4, 40, 20, Decimal("1.5")),
        },
        "jobType": {
            "other_type": (1, 10, 5, Decimal("0.3")),
            "synthetic": (7, 67, 30, Decimal("1.500003")),
        },
        "model": {
            "m-a": (6, 60, 30, Decimal("1.800001")),
            "m-b": (2, 17, 5, Decimal("0.000002")),
        },
        "day": {
            past.isoformat(): (4, 40, 20, Decimal("1.5")),
            _today().isoformat(): (4, 37, 15, Decimal("0.300003")),
        },
        "credentialMode": {
            "platform_key": (7, 67, 30, Decimal("1.500003")),
            "user_deepseek_key": (1, 10, 5, Decimal("0.3")),
        },
    }
    async with api_client(settings) as (_, c):
        for group, want in expected.items():
            body = await _get(
                c, settings, f"/admin-api/ai/usage?groupBy={group}", "root", admin=True
            )
            assert body["groupBy"] == group
            assert {i["key"]: _sums(i) for i in body["items"]} == want, group
            assert [i["key"] for i in body["items"]] == sorted(want), "items in key order"
            assert _sums(body["total"]) == (8, 77, 35, Decimal("1.800003"))

        q = "/admin-api/ai/usage?groupBy=model&userId=alice&jobType=synthetic"
        body = await _get(c, settings, q, "root", admin=True)
        assert {i["key"]: _sums(i) for i in body["items"]} == {
            "m-a": (1, 10, 5, Decimal("0.000001")),
            "m-b": (1, 10, 5, Decimal("0.000002")),
        }
        q = "/admin-api/ai/usage?groupBy=user&model=m-b&credentialMode=platform_key"
        body = await _get(c, settings, q, "root", admin=True)
        assert [i["key"] for i in body["items"]] == ["alice", "bob"]

        # The range is inclusive at both ends; outside it nothing is summed.
        day = past.isoformat()
        body = await _get(
            c, settings, f"/admin-api/ai/usage?from={day}&to={day}", "root", admin=True
        )
        assert [i["key"] for i in body["items"]] == [day]
        before = (past - timedelta(days=1)).isoformat()
        body = await _get(
            c, settings, f"/admin-api/ai/usage?from={before}&to={before}", "root", admin=True
        )
        assert body["items"] == [] and body["total"]["costUsd"] == "0.00000000"

        # Alice's own view: neither bob's nor carol's buckets.
        own = await _get(c, settings, "/api/ai/usage?groupBy=model", "alice")
        assert _sums(own["total"]) == expected["user"]["alice"]

        # The failed call's code, per attempt, in the job's usage.
        job = await _get(c, settings, f"/api/ai/jobs/{b}/usage", "bob")
        assert job["attempts"] == [
            {
                "attempt": 1,
                "calls": 1,
                "tokensIn": 7,
                "tokensOut": 0,
                "costUsd": "0.00000000",
                "estimatedCostUsd": "0.00000000",
                "errorCodes": ["PROVIDER_TIMEOUT"],
                "providerCalls": [
                    {
                        "costUsd": "0.00000000",
                        "costBasis": "reported",
                        "model": "m-b",
                        "pricedAs": None,
                        "tokensIn": 7,
                        "tokensOut": 0,
                        "cachedInputTokens": 0,
                        "reasoningTokens": 0,
                        "serviceTier": "standard",
                    }
                ],
            }
        ]


async def test_date_range_defaults_and_validation(idle_stack: Stack, settings: Settings) -> None:
    async with api_client(settings) as (_, c):
        body = await _get(c, settings, "/api/ai/usage", "alice")
        assert body["to"] == _today().isoformat()
        assert body["from"] == (_today() - timedelta(days=29)).isoformat()
        assert body["groupBy"] == "day" and body["items"] == []
        assert body["total"] == {
            "calls": 0,
            "tokensIn": 0,
            "tokensOut": 0,
            "costUsd": "0.00000000",
            "estimatedCostUsd": "0.00000000",
        }

        to = date(2026, 12, 31)
        longest = f"from={(to - timedelta(days=365)).isoformat()}&to={to.isoformat()}"
        assert (
            await c.get(f"/api/ai/usage?{longest}", headers=auth(settings, "a"))
        ).status_code == 200

        cases = {
            f"from={(to - timedelta(days=366)).isoformat()}&to={to.isoformat()}": "from",
            "from=2026-02-02&to=2026-02-01": "from",
            "to=2026-02-30": "to",
            "from=1700000000": "from",
            "from=2026-1-1": "from",
            "groupBy=user": "groupBy",
        }
        for query, field in cases.items():
            for path, admin in (("/api/ai/usage", False), ("/admin-api/ai/usage", True)):
                if field == "groupBy" and admin:
                    continue  # the admin route groups by user
                r = await c.get(f"{path}?{query}", headers=auth(settings, "a", admin=admin))
                assert r.status_code == 422, (path, query, r.text)
                problem = r.json()
                assert problem["code"] == "VALIDATION_FAILED"
                assert [field] in [e["loc"][-1:] for e in problem["errors"]], (query, problem)
        r = await c.get(
            "/admin-api/ai/usage?groupBy=everything", headers=auth(settings, "r", admin=True)
        )
        assert r.status_code == 422


# ---- the rollup under concurrency -----------------------------------------------------------

WRITERS = 8
CALLS_EACH = 25


async def test_rollup_equals_the_log_after_concurrent_inserts(
    idle_stack: Stack, db: SessionMaker
) -> None:
    """Eight writers on their own connections insert at once, mostly into one hot bucket (same
    user, type, model and mode): a lost update would leave the rollup short of the log."""
    jobs = [await idle_stack.create(user_id=f"u{i % 2}") for i in range(4)]
    start = asyncio.Event()

    async def writer(n: int) -> None:
        await start.wait()
        for k in range(CALLS_EACH):
            job = jobs[(n + k) % len(jobs)]
            await _insert(
                db,
                job,
                f"u{jobs.index(job) % 2}",
                model="m-a" if k % 5 else "m-b",
                tokens=(n + k, k),
                cost=f"0.0000{n}{k:02d}1",
                attempt=1 + k % 3,
            )

    tasks = [asyncio.create_task(writer(n)) for n in range(WRITERS)]
    start.set()
    await asyncio.gather(*tasks)

    async with db() as s:
        rollup = (
            await s.execute(
                text(
                    "SELECT day, user_id, job_type, model, credential_mode, calls, tokens_in, "
                    "tokens_out, cost_usd FROM ai_usage_daily ORDER BY 1, 2, 3, 4, 5"
                )
            )
        ).all()
        from_log = (
            await s.execute(
                text(
                    """
                    SELECT (u.created_at AT TIME ZONE 'UTC')::date, u.user_id, j.job_type,
                           u.model, u.credential_mode, count(*), sum(u.tokens_in),
                           sum(u.tokens_out), sum(u.cost_usd)
                    FROM ai_usage_log u JOIN ai_job j ON j.id = u.job_id
                    GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5
                    """
                )
            )
        ).all()
        spend = (
            await s.execute(
                text(
                    """
                    SELECT j.id, j.spent_cost_usd, coalesce(sum(u.cost_usd), 0)
                    FROM ai_job j LEFT JOIN ai_usage_log u ON u.job_id = j.id GROUP BY j.id
                    """
                )
            )
        ).all()
    assert sum(r[5] for r in from_log) == WRITERS * CALLS_EACH
    assert [tuple(r) for r in rollup] == [tuple(r) for r in from_log]
    assert all(spent == total and total > 0 for _, spent, total in spend), spend


# ---- the benchmark, small -------------------------------------------------------------------


async def test_the_usage_bench_runs_small_and_its_reads_use_their_indexes(
    db: SessionMaker, database_url: str
) -> None:
    """`python -m bench.usage --rows 20000`, on this test's database: the load's rollup equals
    the log (checked inside), and the per-user and per-job reads go through their indexes."""
    figures = await run_on(database_url, rows=20_000, users=100, repeat=2, baseline_repeat=1)
    reads = {r.name: r for r in figures.reads}
    assert figures.jobs == 1000 and figures.rollup_rows > 0
    assert set(reads) >= {"own day", "own jobType", "own model", "job usage"}
    for name in ("own day", "own jobType", "own model"):
        assert reads[name].indexes == ["ix_ai_usage_daily_user_day"], reads[name]
    assert reads["job usage"].indexes == ["ix_ai_usage_log_job_id"]
    assert set(figures.ratios) == {"user", "jobType", "model", "day", "credentialMode"}
    # The same admin sums from the rollup and from the log (the baseline reads one day range).
    assert {g: reads[f"admin {g}"].rows for g in figures.ratios} == {
        g: reads[f"admin {g} from the log"].rows for g in figures.ratios
    }


async def test_the_usage_routes_are_documented(settings: Settings) -> None:
    async with api_client(settings) as (_, c):
        spec = (await c.get("/openapi.json")).json()
    paths = spec["paths"]
    own = paths["/api/ai/usage"]["get"]
    admin = paths["/admin-api/ai/usage"]["get"]
    job = paths["/api/ai/jobs/{jobId}/usage"]["get"]
    assert {"401", "422", "503"} <= own["responses"].keys()
    assert {"401", "403", "422"} <= admin["responses"].keys()
    assert {"401", "404"} <= job["responses"].keys()
    assert {p["name"] for p in own["parameters"]} == {"from", "to", "groupBy"}
    assert {p["name"] for p in admin["parameters"]} == {
        "from",
        "to",
        "groupBy",
        "userId",
        "jobType",
        "model",
        "credentialMode",
        "orgId",
        "teamId",
        "tag",
    }
    comps = spec["components"]["schemas"]
    assert comps["UsageReport"]["examples"] and comps["JobUsageResponse"]["examples"]
    cost = comps["UsageSums"]["properties"]["costUsd"]
    assert cost["type"] == "string" and re.fullmatch(cost["pattern"], "0.00066000")
