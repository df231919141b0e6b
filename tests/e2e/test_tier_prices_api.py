"""Tier prices over HTTP: a quote shows the job's standard and batch prices (batch half, for a
provider with a batch API), a batch create whose provider has no batch API is a 422 naming the
provider (never run at standard instead), and each provider call of a job's usage says its
serviceTier. API only: no call is made."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

from db import usage as usage_db
from db.session import SessionMaker
from db.usage import UsageRow
from tests.e2e.conftest import Api, start_api

CARDS = {"sourceText": "Ribosomes assemble proteins from amino acids. " * 10, "count": 5}
# An OpenAI-compatible server that is not DeepSeek's: it has a batch API (never reached here).
GENERIC = {
    "AI_BASE_URL": "http://127.0.0.1:9/v1",
    "DEEPSEEK_API_KEY": "platform-key",
    "AI_MODEL": "gpt-4o-mini",
}


def cards(**extra: Any) -> dict[str, Any]:
    return {
        "jobType": "flashcard_generation",
        "targetType": "course",
        "targetId": "c-1",
        "input": CARDS,
        **extra,
    }


async def test_a_quote_shows_both_prices_and_reserves_at_the_quoted_tier(
    db: SessionMaker, env: Any
) -> None:
    async with start_api(env(**GENERIC)) as api:
        headers = api.as_user("alice")
        r = await api.http.post("/api/ai/jobs/quote", json=cards(), headers=headers)
        assert r.status_code == 200, r.text
        q = r.json()
        assert q["serviceTier"] == "standard"
        prices = {t["serviceTier"]: t for t in q["tierPrices"]}
        assert prices["standard"]["available"] and prices["batch"]["available"]
        assert prices["standard"]["worstCaseCostUsd"] == q["worstCaseCostUsd"]
        half = Decimal(prices["standard"]["worstCaseCostUsd"]) / 2
        assert abs(Decimal(prices["batch"]["worstCaseCostUsd"]) - half) <= Decimal("1e-8")

        r = await api.http.post(
            "/api/ai/jobs/quote", json=cards(serviceTier="batch"), headers=headers
        )
        assert r.status_code == 200, r.text
        assert r.json()["serviceTier"] == "batch"
        assert r.json()["worstCaseCostUsd"] == prices["batch"]["worstCaseCostUsd"]

        # A user's own key goes to DeepSeek's endpoint, which has no batch API.
        r = await api.http.post(
            "/api/ai/jobs",
            json=cards(serviceTier="batch", credentialMode="user_deepseek_key"),
            headers=headers,
        )
        assert r.status_code == 422, r.text
        assert r.json()["code"] == "VALIDATION_FAILED"
        assert ["serviceTier"] in [e["loc"] for e in r.json()["errors"]]
        assert "deepseek" in r.text


async def test_a_batch_create_on_the_synthetic_provider_is_refused(api: Api) -> None:
    r = await api.create(
        input=CARDS, jobType="flashcard_generation", serviceTier="batch", expect=422
    )
    assert ["serviceTier"] in [e["loc"] for e in r.json()["errors"]]
    assert "synthetic" in r.text


async def test_each_provider_call_says_its_service_tier(api: Api, db: SessionMaker) -> None:
    job_id = await api.create_id()
    async with db.begin() as s:
        for attempt, tier in ((1, "standard"), (2, "batch")):
            row = UsageRow(
                uuid.UUID(job_id),
                "alice",
                "synthetic",
                attempt,
                "platform_key",
                "p",
                "m",
                10,
                5,
                Decimal("0.00000100"),
                1,
                None,
                service_tier=tier,
            )
            await usage_db.insert(s, row)
    r = await api.http.get(f"/api/ai/jobs/{job_id}/usage", headers=api.as_user("alice"))
    assert r.status_code == 200, r.text
    calls = [c for a in r.json()["attempts"] for c in a["providerCalls"]]
    assert [c["serviceTier"] for c in calls] == ["standard", "batch"]
