"""A usage row is priced by the model the provider echoes, and that is never silently zero: the
fake OpenAI server answers a request for `gpt-4o-mini` as OpenAI does, with a dated id."""

from __future__ import annotations

from decimal import Decimal

from temporalio.client import Client

from db.session import SessionMaker
from providers.pricing import PriceTable
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import fake_env, usage_rows
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, engine_stack, make_settings

DATED = "gpt-4o-mini-2024-07-18"
JOB_TYPE = "flashcard_generation"


async def test_a_dated_model_id_is_charged_its_models_price(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    answer = {"kind": "valid", "content": SCRIPTED[JOB_TYPE], "echo_model": DATED}
    await fake.ascript([], default={**answer, "tokens_in": 1200, "tokens_out": 800})
    settings = make_settings(
        database_url, temporal_address, **fake_env(fake, AI_MODEL="gpt-4o-mini")
    )
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        job_id = await stack.create(
            job_type=JOB_TYPE, target_type="lesson", target_id="L-1", input=INPUTS[JOB_TYPE]
        )
        row = await stack.wait_status(job_id, "succeeded", "failed", timeout=30)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        [u] = await usage_rows(stack, job_id)
    assert (await fake.acalls())["models"] == ["gpt-4o-mini"]
    assert u.model == DATED  # what the provider said, recorded as it said it
    # gpt-4o-mini: 0.15 / 0.60 USD per million tokens.
    assert u.cost_usd == Decimal("0.00066") == PriceTable().cost_usd("gpt-4o-mini", 1200, 800)
    assert u.cost_usd > 0
