"""The AI job types end to end: quiz_generation, flashcard_generation, weak_point_analysis.

Each runs through the real engine (relay → Temporal workflow → stages → projector) twice: on
the synthetic provider (default settings, no key: the offline path) and against the fake
OpenAI-compatible server with a platform key (the real HTTP path). The checks are what users
depend on: business rows and artifacts with deterministic ids, the prompt version on the job,
one usage row per call with its cost, the key sent as a bearer token.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.client import Client

from db.session import SessionMaker
from jobs.spec import AnyJobType, ProjectionContext, artifact_uuid
from jobs.types import default_catalog
from providers.pricing import cost_usd
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.engine_helpers import project_in
from tests.integration.provider_helpers import (
    FAKE_MODEL,
    PLATFORM_KEY,
    api_client,
    auth,
    fake_env,
    usage_rows,
    user_prompts,
)
from tests.job_data import ANSWERS, INPUTS, SCRIPTED, SOURCE
from tests.stack import JOB_QUEUES, Stack, engine_stack, make_settings

TABLES = {
    "quiz_generation": "quiz_question",
    "flashcard_generation": "flashcard",
    "weak_point_analysis": "weak_point_candidate",
}
JOB_TYPES = list(INPUTS)


def _jt(job_type: str) -> AnyJobType:
    return default_catalog().get(job_type)


def _items(job_type: str, output: dict[str, Any]) -> list[dict[str, Any]]:
    key = {
        "quiz_generation": "questions",
        "flashcard_generation": "flashcards",
        "weak_point_analysis": "weak_points",
    }[job_type]
    items: list[dict[str, Any]] = output[key]
    return items


async def _business_rows(sm: SessionMaker, job_type: str, job_id: uuid.UUID) -> list[Any]:
    async with sm() as s:
        rows = await s.execute(
            text(f"SELECT * FROM {TABLES[job_type]} WHERE job_id = :j ORDER BY ordinal"),
            {"j": job_id},
        )
        return list(rows)


async def _artifacts(sm: SessionMaker, job_id: uuid.UUID) -> list[tuple[str, str, int]]:
    async with sm() as s:
        rows = await s.execute(
            text(
                "SELECT artifact_type, artifact_id, ordinal FROM ai_job_artifact "
                "WHERE job_id = :j ORDER BY ordinal"
            ),
            {"j": job_id},
        )
        return [(r.artifact_type, r.artifact_id, r.ordinal) for r in rows]


async def _check_projection(
    stack: Stack, job_type: str, job_id: uuid.UUID, output: dict[str, Any]
) -> None:
    """Business rows = the output's items, ids from artifact_uuid, one artifact per row."""
    sm = stack.parts.sessionmaker
    items = _items(job_type, output)
    rows = await _business_rows(sm, job_type, job_id)
    art_type = TABLES[job_type]
    assert [r.ordinal for r in rows] == list(range(len(items)))
    assert [r.id for r in rows] == [artifact_uuid(job_id, art_type, n) for n in range(len(items))]
    assert all(r.user_id == "u1" for r in rows)
    for r, item in zip(rows, items, strict=True):
        if job_type == "quiz_generation":
            assert (r.question, r.choices, r.answer_index, r.explanation) == (
                item["question"],
                item["choices"],
                item["answer_index"],
                item["explanation"],
            )
            assert r.difficulty == "hard"  # what the user asked for
            assert (r.target_type, r.target_id) == ("lesson", "L-42")
        elif job_type == "flashcard_generation":
            assert (r.front, r.back) == (item["front"], item["back"])
            assert (r.target_type, r.target_id) == ("lesson", "L-42")
        else:
            assert (r.topic, r.evidence, r.recommended_action) == (
                item["topic"],
                item["evidence"],
                item["recommended_action"],
            )
    assert await _artifacts(sm, job_id) == [(art_type, str(r.id), r.ordinal) for r in rows]

    # Idempotent projector: a second projection of the same output writes nothing new.
    jt = _jt(job_type)
    row = await stack.job(job_id)
    ctx = ProjectionContext(job_id, "u1", "lesson", "L-42", row.output_hash, row.input)
    async with sm.begin() as s:
        again = await project_in(s, jt.projection, ctx, jt.output_model.model_validate(output))
    assert [(a.artifact_type, a.artifact_id, a.ordinal) for a in again] == await _artifacts(
        sm, job_id
    )
    assert len(await _business_rows(sm, job_type, job_id)) == len(items)


# ---- offline: the synthetic provider ----------------------------------------------------------


@pytest.mark.parametrize("job_type", JOB_TYPES)
async def test_job_type_runs_offline_on_synthetic_provider(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    job_type: str,
) -> None:
    settings = make_settings(database_url, temporal_address)  # no key, no base URL
    jt = _jt(job_type)
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        job_id = await stack.create(
            job_type=job_type, target_type="lesson", target_id="L-42", input=INPUTS[job_type]
        )
        row = await stack.wait_status(job_id, "succeeded", "failed", timeout=30)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert row.prompt_version == jt.definition.prompt_version
        assert row.prompt_version.startswith(f"{job_type}.v")
        assert row.queue_name == jt.definition.queue.queue_name
        expected = jt.output_model.model_validate(
            jt.synthetic_output(jt.input_model.model_validate(INPUTS[job_type]))
        ).model_dump(mode="json")
        assert row.output == expected
        assert _items(job_type, expected), "the synthetic output must not be empty here"
        await _check_projection(stack, job_type, job_id, expected)
        usage = await usage_rows(stack, job_id)
        assert len(usage) == 1
        u = usage[0]
        assert (u.provider, u.model, u.error_code) == ("synthetic", "synthetic", None)
        assert u.credential_mode == "platform_key"
        assert u.tokens_in > 0 and u.tokens_out > 0
        assert u.cost_usd == Decimal(0)  # offline calls are free, not priced as AI_MODEL


# ---- the OpenAI-compatible path: fake server, platform key --------------------------------------


@pytest.mark.parametrize("job_type", JOB_TYPES)
async def test_job_type_runs_against_openai_compatible_server(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
    job_type: str,
) -> None:
    content = SCRIPTED[job_type]
    await fake.ascript(
        [{"kind": "valid", "content": content, "tokens_in": 1234, "tokens_out": 567}]
    )
    settings = make_settings(database_url, temporal_address, **fake_env(fake))
    jt = _jt(job_type)
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        job_id = await stack.create(
            job_type=job_type, target_type="lesson", target_id="L-42", input=INPUTS[job_type]
        )
        row = await stack.wait_status(job_id, "succeeded", "failed", timeout=30)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert row.prompt_version == jt.definition.prompt_version
        assert row.output == content
        await _check_projection(stack, job_type, job_id, content)

        calls = await fake.acalls()
        assert calls["count"] == 1
        assert calls["authorizations"] == [f"Bearer {PLATFORM_KEY}"]
        assert calls["models"] == [FAKE_MODEL]
        [messages] = await fake.amessages()
        system = next(m["content"] for m in messages if m["role"] == "system")
        assert system == jt.build_prompt(jt.input_model.model_validate(INPUTS[job_type])).system
        assert "JSON" in system
        [user] = await user_prompts(fake)
        if job_type == "weak_point_analysis":
            assert "mitochondria" in user and "chloroplasts" in user
        else:
            assert "Chlorophyll absorbs mostly blue and red light." in user
        assert "Correction" not in user

        usage = await usage_rows(stack, job_id)
        assert len(usage) == 1
        u = usage[0]
        assert (u.provider, u.model, u.error_code) == ("openai_compatible", FAKE_MODEL, None)
        assert (u.tokens_in, u.tokens_out) == (1234, 567)
        assert u.cost_usd == cost_usd(FAKE_MODEL, 1234, 567)
        assert u.cost_usd > 0


# ---- the job types' contracts (no engine needed) -------------------------------------------------


async def test_api_rejects_out_of_bounds_input(db: SessionMaker, settings: Any) -> None:
    async with api_client(settings) as (_, client):
        bad = await client.post(
            "/api/ai/jobs",
            json={
                "jobType": "quiz_generation",
                "targetType": "lesson",
                "targetId": "L-1",
                "input": {"sourceText": SOURCE, "count": 21},
            },
            headers=auth(settings, "u1"),
        )
        assert bad.status_code == 422, bad.text
        assert bad.json()["code"] == "VALIDATION_FAILED"
        assert SOURCE not in bad.text
        ok = await client.post(
            "/api/ai/jobs",
            json={
                "jobType": "weak_point_analysis",
                "targetType": "learner",
                "targetId": "u1",
                "input": {"answers": ANSWERS},
            },
            headers=auth(settings, "u1"),
        )
        assert ok.status_code == 202, ok.text
        assert ok.json()["queueName"] == "ai-background"
