"""Create-path edge cases found by review and fuzzing: what counts as "the same request", numbers
JSON cannot carry, and a production deployment without any provider credential."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from sqlalchemy import text

from db.session import SessionMaker
from engine.errors import PlatformUnavailable, RequestTooLarge, ValidationFailed
from engine.settings import Settings
from jobs.service import CreateJobRequest, CreatePolicy, JobService
from jobs.types import default_catalog
from runtime.wiring import create_policy

NO_QUOTAS = CreatePolicy(max_active_jobs=0, max_jobs_per_day=0)


def _req(**kw: object) -> CreateJobRequest:
    values: dict[str, Any] = {
        "user_id": "u1",
        "job_type": "synthetic",
        "target_type": "t",
        "target_id": "1",
        "input": {},
        "idempotency_key": "k1",
    }
    values.update(kw)
    return CreateJobRequest(**values)


async def test_omitted_priority_and_the_default_priority_are_the_same_request(
    db: SessionMaker,
) -> None:
    svc = JobService(db, default_catalog(), NO_QUOTAS)
    first = await svc.create(_req(priority=None))
    default = default_catalog().get("synthetic").definition.queue.default_priority
    second = await svc.create(_req(priority=default))
    assert second.job.id == first.job.id and not second.created


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
async def test_non_finite_numbers_are_rejected_not_rewritten(db: SessionMaker, bad: float) -> None:
    svc = JobService(db, default_catalog(), NO_QUOTAS)
    with pytest.raises(ValidationFailed):
        await svc.create(_req(input={"echo": {"x": [1, {"y": bad}]}}, idempotency_key=None))


async def test_production_without_a_provider_refuses_platform_key_jobs(db: SessionMaker) -> None:
    prod = Settings.model_validate({"AIJOBS_ENV": "production"})
    assert not prod.platform_key_configured
    svc = JobService(db, default_catalog(), create_policy(prod))
    with pytest.raises(PlatformUnavailable):
        await svc.create(
            _req(
                job_type="flashcard_generation",
                input={"sourceText": "Photosynthesis turns light into chemical energy."},
            )
        )
    keyed = Settings.model_validate({"AIJOBS_ENV": "production", "DEEPSEEK_API_KEY": "sk-x"})
    assert keyed.platform_key_configured


async def test_an_input_that_cannot_fit_the_models_window_is_refused_at_create(
    db: SessionMaker,
) -> None:
    """Prompt (a lower-bound estimate) + the type's output budget over the configured model's
    context window: 422 REQUEST_TOO_LARGE naming the limit, nothing queued. A shorter input to
    the same model is accepted."""
    # 4400 tokens leave 304 beside the answer budget of 4096: not even one chunk of a long
    # source fits with its prompt, so chunking cannot help either.
    small = Settings.model_validate(
        {
            "AIJOBS_ENV": "test",
            "AI_MODEL": "tiny-model",
            "AI_MODEL_PRICES": '{"tiny-model": {"input": 1, "output": 2, "context_window": 4400}}',
        }
    )
    policy = dataclasses.replace(create_policy(small), max_active_jobs=0, max_jobs_per_day=0)
    assert policy.context_window == 4400
    svc = JobService(db, default_catalog(), policy)
    long_text = "Photosynthesis turns light into chemical energy in the chloroplasts. " * 200
    with pytest.raises(RequestTooLarge) as refused:
        await svc.create(
            _req(job_type="flashcard_generation", input={"sourceText": long_text, "count": 2})
        )
    assert refused.value.http_status == 422
    assert "4400" in refused.value.public_message and "4096" in refused.value.public_message
    async with db() as s:
        assert (await s.execute(text("SELECT count(*) FROM ai_job"))).scalar_one() == 0
    fits = await svc.create(
        _req(job_type="flashcard_generation", input={"sourceText": long_text[:200], "count": 2})
    )
    assert fits.created and fits.job.chunk_count is None
    # A larger window leaves room for chunks: the same long source is planned as several calls,
    # each within the window, instead of being refused.
    roomy = dataclasses.replace(policy, context_window=6000)
    chunked = await JobService(db, default_catalog(), roomy).create(
        _req(
            job_type="flashcard_generation",
            input={"sourceText": long_text, "count": 2},
            idempotency_key="k2",
        )
    )
    assert chunked.created and (chunked.job.chunk_count or 0) >= 2
