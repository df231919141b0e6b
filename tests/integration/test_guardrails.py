"""Guardrails over real HTTP: PII masked before any call and restored in the output, output items
moderated before anything publishes them, and a moderation endpoint that fails costing no
second call.

One fake OpenAI-compatible server answers the chat calls (streamed) and `/v1/moderations`
(flagging texts that contain a scripted term).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import text
from temporalio.client import Client

from db.session import SessionMaker
from engine.settings import Settings
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import api_client, auth, fake_env, usage_rows
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, Stack, engine_stack, make_settings

FLASH, WEAK = "flashcard_generation", "weak_point_analysis"
EMAIL, PHONE = "alice.smith@example.com", "+44 20 7946 0958"
PII_SOURCE = (
    f"Write to Alice at {EMAIL} or call her on {PHONE} about photosynthesis. "
    f"Her address {EMAIL} is also her login."
)
CARDS = [
    {"front": "What converts light into chemical energy?", "back": "Photosynthesis."},
    {"front": "What is the forbidden recipe?", "back": "BANNED content here."},
    {"front": "Where does it take place?", "back": "In the chloroplasts."},
]


def _settings(database_url: str, temporal_address: str, fake: FakeOpenAIServer) -> Settings:
    return make_settings(
        database_url,
        temporal_address,
        **fake_env(fake, AI_MODERATION_MODEL="omni-moderation-latest"),
    )


async def _rows(stack: Stack, sql: str, job_id: uuid.UUID) -> list[Any]:
    async with stack.parts.sessionmaker() as s:
        return list(await s.execute(text(sql), {"j": job_id}))


async def _view(settings: Settings, job_id: uuid.UUID) -> dict[str, Any]:
    async with api_client(settings) as (_, c):
        got = await c.get(f"/api/ai/jobs/{job_id}", headers=auth(settings, "u1"))
        assert got.status_code == 200, got.text
        arts = await c.get(f"/api/ai/jobs/{job_id}/artifacts", headers=auth(settings, "u1"))
    body: dict[str, Any] = got.json()
    body["_artifacts"] = arts.json()["items"]
    return body


async def test_pii_never_reaches_the_provider_and_the_output_gets_the_originals_back(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    settings = _settings(database_url, temporal_address, fake)
    card = {"front": "How can Alice be reached?", "back": "At <EMAIL_1> or on <PHONE_1>."}
    await fake.ascript([], default={"kind": "valid", "content": {"flashcards": [card]}})
    source = {"sourceText": PII_SOURCE, "count": 1}
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        job = await stack.create(job_type=FLASH, input=source)
        row = await stack.wait_status(job, "succeeded", "failed", timeout=60)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        sent = json.dumps(await fake.amessages())
        assert EMAIL not in sent and PHONE not in sent
        assert "<EMAIL_1>" in sent and "<PHONE_1>" in sent
        # Placeholders go to moderation, never the originals.
        moderated = json.dumps(await fake.amoderations())
        assert "<EMAIL_1>" in moderated and EMAIL not in moderated and PHONE not in moderated
        restored = f"At {EMAIL} or on {PHONE}."
        assert row.output == {"flashcards": [{"front": card["front"], "back": restored}]}
        assert row.input == source  # the stored input is as the user wrote it
        [stored] = await _rows(stack, "SELECT back FROM flashcard WHERE job_id = :j", job)
        assert stored.back == restored
        streamed = await _rows(
            stack, "SELECT content FROM ai_job_stream_item WHERE job_id = :j", job
        )
        assert all(EMAIL in json.dumps(r.content) for r in streamed)
        view = await _view(settings, job)
        assert view["result"]["flaggedItems"] == 0
        assert view["_artifacts"][0]["content"]["back"] == restored


async def test_a_flagged_card_is_never_published_and_is_counted(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    settings = _settings(database_url, temporal_address, fake)
    await fake.amoderation(flag=["BANNED"])
    step = {
        "kind": "valid",
        "content": {"flashcards": CARDS},
        "chunk_chars": 16,
        "tokens_in": 300,
        "tokens_out": 120,
    }
    await fake.ascript([], default=step)
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        job = await stack.create(job_type=FLASH, input={**INPUTS[FLASH], "count": 3})
        row = await stack.wait_status(job, "succeeded", "failed", timeout=60)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert (await fake.astreams())["stream"] == [True]
        streamed = await _rows(
            stack, "SELECT ordinal, content FROM ai_job_stream_item WHERE job_id = :j", job
        )
        assert "BANNED" not in json.dumps([r.content for r in streamed])
        assert sorted(r.ordinal for r in streamed) == [0, 2]
        assert row.output == {"flashcards": [CARDS[0], CARDS[2]]}
        view = await _view(settings, job)
        assert view["result"]["flaggedItems"] == 1
        assert view["result"]["artifactCount"] == 2
        assert "BANNED" not in json.dumps(view["_artifacts"])
        [usage] = await usage_rows(stack, job)
        assert (usage.error_code, usage.tokens_in, usage.tokens_out) == (None, 300, 120)
        assert usage.cost_usd > 0  # the call is charged; moderation adds nothing


async def test_every_card_flagged_fails_and_fail_mode_fails_on_one(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    settings = _settings(database_url, temporal_address, fake)
    await fake.amoderation(flag=["BANNED", "Membranes"])
    banned = {"flashcards": [{"front": "BANNED?", "back": "BANNED."}]}
    await fake.ascript(
        [],
        default={"kind": "valid", "content": banned},
        rules=[("learning coach", {"kind": "valid", "content": SCRIPTED[WEAK]})],
    )
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        deck = await stack.create(job_type=FLASH, input=INPUTS[FLASH])
        weak = await stack.create(job_type=WEAK, input=INPUTS[WEAK])
        for job in (deck, weak):
            row = await stack.wait_status(job, "succeeded", "failed", timeout=60)
            assert (row.lifecycle_status, row.error_code) == ("failed", "CONTENT_SAFETY_BLOCKED")
            assert row.attempt_count == 1  # not retried
            [usage] = await usage_rows(stack, job)
            assert usage.error_code == "CONTENT_SAFETY_BLOCKED" and usage.cost_usd > 0


async def test_moderation_away_fails_the_attempt_and_the_retry_makes_no_new_call(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    settings = _settings(database_url, temporal_address, fake)
    # Down for the streamed items' check and the answer's: the attempt fails.
    await fake.amoderation(status=503, fail_times=2)
    await fake.ascript([], default={"kind": "valid", "content": SCRIPTED[FLASH]})
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        job = await stack.create(job_type=FLASH, input=INPUTS[FLASH])
        row = await stack.wait_status(job, "succeeded", "failed", timeout=60)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert row.attempt_count == 2
        assert (await fake.acalls())["count"] == 1  # one chat call for both attempts
        assert len(await fake.amoderations()) == 3
        assert row.output == SCRIPTED[FLASH] and row.held_answer is None
        assert row.internal_error_message == "moderation: HTTP 503"  # no text of the answer
        [usage] = await usage_rows(stack, job)
        assert usage.error_code is None and usage.cost_usd > 0
        async with stack.parts.sessionmaker() as s:
            breaker = (
                (await s.execute(text("SELECT consecutive_failures FROM provider_gate")))
                .scalars()
                .all()
            )
        assert all(n == 0 for n in breaker)
