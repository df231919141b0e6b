"""Tokens and money checked from outside: the real API over HTTP, workers and relay in process,
the session's PostgreSQL and Temporal dev server, and an OpenAI-compatible mock as the provider
(`AI_BASE_URL`) for the priced model `deepseek-chat`, so every call costs money.

What users depend on:
- a user's daily cost budget holds under 30 concurrent creates: exactly the jobs whose worst
  cases fit are admitted, the rest are 429 QUOTA_EXCEEDED with Retry-After, spend plus open
  reservations never pass the budget, room comes back when jobs end below their worst case, and
  another user is untouched;
- a quote tells the truth (its token estimate is within the estimate's margin of what the
  provider counted, the real cost stays under its worst case), creates nothing, and refuses
  exactly what a create would refuse;
- `maxCostUsd` cuts the `max_tokens` the provider is asked for, a cap too low is refused, and
  an Idempotency-Key cannot be reused with another cap;
- a tokens-per-minute limit paces calls before the provider would answer 429, spending no
  attempt;
- the usage endpoints' sums are the per-job figures.

Two mocks: our scriptable fake (tests/fakes/openai_server.py) reports whatever usage it is
scripted to, records each call's `max_tokens` and start time; fakellm (a third party's mock,
PyPI) counts prompt tokens itself, which is what the quote is compared against.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import math
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from bench.isolation import FakeLLM, fakellm_server, isolation_rules
from db.session import SessionMaker
from jobs.costs import ESTIMATE_MARGIN
from tests.e2e.conftest import Api, assert_problem, start_api
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import FAKE_MODEL, PLATFORM_KEY
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, TERMINAL, engine_stack
from tests.support import eventually

pytestmark = pytest.mark.slow

QUIZ = "quiz_generation"
ALICE, BOB = "alice", "bob"
# Several provider calls at once: the budget and the limiter, not the worker's slots, decide.
WIDE = {"AI_INTERACTIVE_CONCURRENCY": 8, "AI_BACKGROUND_CONCURRENCY": 8}
# The estimate margin: the worst case counts the prompt estimate plus this much.
MARGIN = ESTIMATE_MARGIN


def quiz_body(**extra: Any) -> dict[str, Any]:
    return {
        "jobType": QUIZ,
        "targetType": "lesson",
        "targetId": f"L-{uuid.uuid4().hex[:8]}",
        "input": INPUTS[QUIZ],
        **extra,
    }


def usd(value: str) -> Decimal:
    return Decimal(value)


@contextlib.asynccontextmanager
async def engine_and_api(
    env: Any, temporal_client: Client, base_url: str, **overrides: Any
) -> AsyncIterator[Api]:
    """Workers and relay for every job queue and the API over HTTP, on one test's settings, with
    the platform key's calls going to the mock at `base_url`."""
    settings = env(**provider_env(base_url), **WIDE, **overrides)
    async with (
        engine_stack(settings, temporal_client, queues=JOB_QUEUES),
        start_api(settings, temporal=temporal_client) as api,
    ):
        yield api


def provider_env(base_url: str) -> dict[str, Any]:
    """The platform key's calls go to the mock at `base_url` (ours or fakellm), for the priced
    model."""
    return {
        "AI_BASE_URL": base_url,
        "USER_KEY_ALLOWED_BASE_URLS": base_url,
        "DEEPSEEK_API_KEY": PLATFORM_KEY,
        "AI_MODEL": FAKE_MODEL,
    }


async def quote(api: Api, user: str = ALICE, **extra: Any) -> dict[str, Any]:
    r = await api.http.post(
        "/api/ai/jobs/quote", json=quiz_body(**extra), headers=api.as_user(user)
    )
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def default_quote(env: Any, base_url: str) -> dict[str, Any]:
    """The quiz job's quote on a server without budgets (API only): its worst case is what a
    budget must be sized on before the budgeted server starts."""
    async with start_api(env(**provider_env(base_url))) as api:
        return await quote(api)


async def create(
    api: Api, user: str = ALICE, key: str | None = None, **extra: Any
) -> httpx.Response:
    headers = api.as_user(user)
    if key is not None:
        headers["Idempotency-Key"] = key
    return await api.http.post("/api/ai/jobs", json=quiz_body(**extra), headers=headers)


async def job_usage(api: Api, job: str, user: str = ALICE) -> dict[str, Any]:
    r = await api.http.get(f"/api/ai/jobs/{job}/usage", headers=api.as_user(user))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def own_usage(api: Api, user: str = ALICE, **params: str) -> dict[str, Any]:
    r = await api.http.get("/api/ai/usage", params=params, headers=api.as_user(user))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def job_ids(api: Api, user: str = ALICE) -> list[str]:
    r = await api.http.get("/api/ai/jobs", params={"limit": 100}, headers=api.as_user(user))
    assert r.status_code == 200, r.text
    return [item["jobId"] for item in r.json()["items"]]


async def succeeded(api: Api, jobs: list[str], user: str = ALICE, timeout: float = 60) -> None:
    for job in jobs:
        body = await api.wait_status(job, user=user, timeout=timeout)
        assert body["lifecycleStatus"] == "succeeded", body


def daily(q: dict[str, Any]) -> dict[str, Any]:
    windows: list[dict[str, Any]] = [b for b in q["budgets"] if b["window"] == "daily"]
    assert len(windows) == 1, q["budgets"]
    return windows[0]


# ---- 1. a budget under concurrency ---------------------------------------------------------


async def test_a_daily_budget_holds_under_thirty_concurrent_creates(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    # Calls take long enough that no admitted job ends (and gives room back) during the burst,
    # and cost far less than their worst case (50 tokens each way).
    await fake.ascript(
        [],
        default={
            "kind": "slow",
            "delay_s": 3.0,
            "content": SCRIPTED[QUIZ],
            "tokens_in": 50,
            "tokens_out": 50,
        },
    )
    worst = usd((await default_quote(env, fake.base_url))["worstCaseCostUsd"])
    assert worst > 0
    budget = (worst * Decimal("5.5")).quantize(Decimal("0.00000001"))
    covered = int(budget // worst)
    assert covered == 5
    async with engine_and_api(
        env, temporal_client, fake.base_url, QUOTA_MAX_COST_USD_PER_DAY=float(budget)
    ) as api:
        assert usd(daily(await quote(api))["limitUsd"]) == budget  # the float kept its value
        burst = await asyncio.gather(
            *(create(api) for _ in range(30)), create(api, BOB), create(api, BOB)
        )
        alice, bob = burst[:30], burst[30:]
        admitted = [r.json()["jobId"] for r in alice if r.status_code == 202]
        refused = [r for r in alice if r.status_code != 202]
        assert len(admitted) == covered, [r.status_code for r in alice]
        for r in refused:
            assert_problem(r, 429, "QUOTA_EXCEEDED")
            assert int(r.headers["retry-after"]) >= 1
        # Bob's own budget is his: both his jobs fit whatever Alice did.
        assert [r.status_code for r in bob] == [202, 202], [r.text for r in bob]
        assert sorted(await job_ids(api)) == sorted(admitted)  # a refusal created nothing

        samples = 0

        async def sample() -> bool:
            """One look, as a client can take it: the quote's budget (spend and open
            reservations read in one transaction), the usage endpoint's spend, and each job's
            reservation (an active job holds it, an ended one its cost)."""
            nonlocal samples
            samples += 1
            held = daily(await quote(api))
            assert usd(held["spentUsd"]) + usd(held["reservedUsd"]) <= budget, held
            spent = usd((await own_usage(api))["total"]["costUsd"])
            assert spent <= budget
            holding = Decimal(0)
            ended = 0
            for job in admitted:
                status = (await api.get(job))["lifecycleStatus"]
                money = await job_usage(api, job)
                if status in TERMINAL:
                    ended += 1
                    holding += usd(money["costUsd"])
                else:
                    holding += max(usd(money["reservedCostUsd"]), usd(money["costUsd"]))
            assert holding <= budget, holding
            return ended == len(admitted)

        await eventually(sample, timeout=60, interval=0.2, what="Alice's jobs to end")
        assert samples >= 3  # the jobs were watched while they ran, not only after
        await succeeded(api, admitted)

        # Ended jobs hold only what they cost, far below their worst case: room came back.
        held = daily(await quote(api))
        spent = usd((await own_usage(api))["total"]["costUsd"])
        assert usd(held["reservedUsd"]) == 0 and usd(held["spentUsd"]) == spent
        assert 0 < spent < covered * worst
        assert spent + worst <= budget
        again = await create(api)
        assert again.status_code == 202, again.text
        bob_jobs = [r.json()["jobId"] for r in bob]
        await succeeded(api, bob_jobs, user=BOB)
        await succeeded(api, [again.json()["jobId"]])


# ---- 2. a quote against what the provider counted -----------------------------------------


@pytest.fixture(scope="module")
async def fakellm(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FakeLLM]:
    """fakellm answering every call with a valid quiz; it counts prompt tokens itself: with
    tiktoken's `cl100k_base`, or (its vocabulary cannot be downloaded here) len(text) // 4 of
    each message's content."""
    async with fakellm_server(isolation_rules(SCRIPTED[QUIZ]), tmp_path_factory.mktemp("llm")) as s:
        yield s


async def test_a_quote_is_close_to_what_the_provider_counts_and_creates_nothing(
    db: SessionMaker, env: Any, temporal_client: Client, fakellm: FakeLLM
) -> None:
    first = await default_quote(env, fakellm.base_url)
    worst = usd(first["worstCaseCostUsd"])
    # A budget of exactly one worst case: the first job fits, and once it has cost anything
    # the next one cannot fit before the day ends.
    # fakellm streams without a usage chunk: a server that does not support include_usage is
    # named in AI_STREAM_DISABLED_MODELS, so its calls are answered (and counted) whole.
    async with engine_and_api(
        env,
        temporal_client,
        fakellm.base_url,
        QUOTA_MAX_COST_USD_PER_DAY=float(worst),
        AI_STREAM_DISABLED_MODELS="*",
    ) as api:
        q = await quote(api)
        assert q["admitted"] is True and q["refusal"] is None, q
        assert (q["model"], q["jobType"]) == ("deepseek-chat", QUIZ)
        assert usd(q["estimatedCostUsd"]) <= usd(q["worstCaseCostUsd"]) == worst
        # The quote created nothing and counted nothing.
        assert await job_ids(api) == []
        assert (await own_usage(api))["total"]["calls"] == 0
        assert (usd(daily(q)["spentUsd"]), usd(daily(q)["reservedUsd"])) == (Decimal(0), Decimal(0))

        r = await create(api)
        assert r.status_code == 202, r.text
        job = r.json()["jobId"]
        await succeeded(api, [job])
        money = await job_usage(api, job)
        assert money["calls"] == 1 and money["estimatedInputTokens"] == q["estimatedInputTokens"]
        estimate, counted = q["estimatedInputTokens"], money["tokensIn"]
        # fakellm counts len // 4 of the messages' contents, without the chat framing our
        # estimate adds (4 a message, 3 for the reply): the worst case holds while the
        # provider's count stays within the margin the worst case adds to the estimate.
        assert abs(counted - estimate) <= MARGIN * estimate, (estimate, counted)
        assert counted <= math.ceil(estimate * (1 + MARGIN))
        assert 0 < usd(money["costUsd"]) <= worst
        assert money["tokensOut"] <= q["maxOutputTokens"]

        # What was spent leaves less than a worst case today: the quote refuses, until the day
        # ends, and a create is refused the same way.
        refused = await quote(api)
        assert refused["admitted"] is False, refused
        refusal = refused["refusal"]
        assert (refusal["code"], refusal["limit"]) == ("QUOTA_EXCEEDED", "daily_cost_budget")
        until = dt.datetime.fromisoformat(refusal["until"])
        now = dt.datetime.now(dt.UTC)
        assert now < until <= now + dt.timedelta(days=1, seconds=5), refusal
        r = await create(api)
        assert_problem(r, 429, "QUOTA_EXCEEDED")
        assert abs(int(r.headers["retry-after"]) - refusal["retryAfterS"]) <= 5
        assert await job_ids(api) == [job]


# ---- 3. a per-job cost cap -----------------------------------------------------------------


async def test_max_cost_usd_cuts_the_answer_budget_the_provider_is_asked_for(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    await fake.ascript([], default={"kind": "valid", "content": SCRIPTED[QUIZ]})
    async with engine_and_api(env, temporal_client, fake.base_url) as api:
        plain = await quote(api)
        cap = (usd(plain["worstCaseCostUsd"]) / 2).quantize(Decimal("0.00000001"))
        capped = await quote(api, maxCostUsd=str(cap))
        assert capped["maxOutputTokens"] < plain["maxOutputTokens"], (plain, capped)
        assert usd(capped["worstCaseCostUsd"]) <= cap

        key = f"cap-{uuid.uuid4().hex}"
        r = await create(api, key=key, maxCostUsd=str(cap))
        assert r.status_code == 202, r.text
        job = r.json()["jobId"]
        await succeeded(api, [job])
        assert await fake.amax_tokens() == [capped["maxOutputTokens"]]
        money = await job_usage(api, job)
        assert money["maxOutputTokens"] == capped["maxOutputTokens"]
        assert usd(money["maxCostUsd"]) == cap
        assert usd(money["costUsd"]) <= cap

        # A cap that leaves no useful answer: refused, nothing created, no call made.
        r = await create(api, maxCostUsd="0.00000001")
        assert_problem(r, 422, "COST_CAP_TOO_LOW")
        # The same key with another cap is another request.
        r = await create(api, key=key, maxCostUsd=str(cap * 2))
        assert_problem(r, 422, "IDEMPOTENCY_KEY_REUSED")
        assert await job_ids(api) == [job]
        assert len(await fake.amax_tokens()) == 1


# ---- 4. pacing by a tokens-per-minute limit ------------------------------------------------


async def test_a_token_limit_paces_calls_before_the_provider_would_refuse(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    """The first call's answer says no tokens remain (as OpenAI's headers do): the key's bucket
    starts empty then and refills at the limit's rate. Each call uses every token it reserved
    (the fake reports a large prompt), so nothing given back blurs the pacing."""
    drained = {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "10ms"}
    valid = {"kind": "valid", "content": SCRIPTED[QUIZ], "tokens_in": 100_000}
    await fake.ascript([{**valid, "headers": drained}], default=valid)
    per_call = (lambda q: q["estimatedInputTokens"] + q["maxOutputTokens"])(
        await default_quote(env, fake.base_url)
    )
    per_s = 1.0  # calls a second the limit allows: 6 calls need about 6 s of refill
    tpm = math.ceil(per_call * per_s * 60)
    limits = json.dumps({"deepseek-chat": {"tpm": tpm}})
    async with engine_and_api(env, temporal_client, fake.base_url, AI_MODEL_LIMITS=limits) as api:
        r = await create(api)
        assert r.status_code == 202, r.text
        await succeeded(api, [r.json()["jobId"]])
        (drained_at,) = (await fake.atimings())["started_at"]
        created = await asyncio.gather(*(create(api) for _ in range(6)))
        jobs = [c.json()["jobId"] for c in created]
        assert [c.status_code for c in created] == [202] * 6
        await succeeded(api, jobs, timeout=60)
        for job in jobs:
            assert (await api.admin_get(job))["attemptCount"] == 1  # waiting spent no attempt
            money = await job_usage(api, job)
            assert money["calls"] == 1 and money["attempts"][0]["errorCodes"] == [], money
            assert money["estimatedInputTokens"] + money["maxOutputTokens"] == per_call
    timings = await fake.atimings()
    starts = sorted(timings["started_at"][1:])
    assert len(starts) == 6
    # Call k (1-based) after the drain needs k calls' tokens of refill: never sooner.
    for k, started in enumerate(starts, start=1):
        assert started >= drained_at + k * per_call * 60 / tpm - 0.05, (k, drained_at, starts)
    assert starts[-1] - starts[0] >= (len(starts) - 1) / per_s - 1.0, starts


# ---- 5. the usage endpoints' sums ----------------------------------------------------------


async def test_usage_totals_are_the_sums_of_the_jobs(
    db: SessionMaker, env: Any, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    # Each call reports other token counts, so a sum that dropped or doubled one shows.
    steps = [
        {
            "kind": "valid",
            "content": SCRIPTED[QUIZ],
            "tokens_in": 100 + 17 * i,
            "tokens_out": 40 + 3 * i,
        }
        for i in range(5)
    ]
    await fake.ascript(steps)
    async with engine_and_api(env, temporal_client, fake.base_url) as api:
        jobs: dict[str, list[str]] = {ALICE: [], BOB: []}
        for user, n in ((ALICE, 3), (BOB, 2)):
            for _ in range(n):
                r = await create(api, user)
                assert r.status_code == 202, r.text
                jobs[user].append(r.json()["jobId"])
            await succeeded(api, jobs[user], user=user)

        per_user: dict[str, dict[str, Any]] = {}
        for user, ids in jobs.items():
            figures = [await job_usage(api, j, user) for j in ids]
            summed = {
                "calls": sum(f["calls"] for f in figures),
                "tokensIn": sum(f["tokensIn"] for f in figures),
                "tokensOut": sum(f["tokensOut"] for f in figures),
                "costUsd": sum((usd(f["costUsd"]) for f in figures), Decimal(0)),
                "estimatedCostUsd": sum((usd(f["estimatedCostUsd"]) for f in figures), Decimal(0)),
            }
            assert summed["costUsd"] > 0
            total = (await own_usage(api, user))["total"]
            total = {k: usd(v) if k.endswith("CostUsd") else v for k, v in total.items()}
            assert {**total, "costUsd": usd(total["costUsd"])} == summed, (user, total, summed)
            per_user[user] = summed
        assert sum(u["tokensIn"] for u in per_user.values()) == sum(100 + 17 * i for i in range(5))

        r = await api.http.get(
            "/admin-api/ai/usage", params={"groupBy": "user"}, headers=api.as_admin()
        )
        assert r.status_code == 200, r.text
        report = r.json()
        by_user = {
            item["key"]: {
                "calls": item["calls"],
                "tokensIn": item["tokensIn"],
                "tokensOut": item["tokensOut"],
                "costUsd": usd(item["costUsd"]),
                "estimatedCostUsd": usd(item["estimatedCostUsd"]),
            }
            for item in report["items"]
        }
        assert by_user == per_user
        assert usd(report["total"]["costUsd"]) == sum(
            (u["costUsd"] for u in per_user.values()), Decimal(0)
        )
