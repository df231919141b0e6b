"""Structured output over real HTTP: each model is asked in the form it takes, and a form a
server refuses is asked again at once in the next one down, for every process.

The engine's primary is one fake OpenAI-compatible server; its AI_FALLBACKS entry another on its
own port, with its own `structuredOutput`. The fake answers DeepSeek's 400 ("This
response_format type is unavailable now") to the forms a test tells it to refuse, and reports
each call's requested form.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text
from temporalio.client import Client

from db.session import SessionMaker
from engine.settings import Settings
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import api_client, auth, fake_env, usage_rows
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, Stack, engine_stack, make_settings

FLASH, WEAK = "flashcard_generation", "weak_point_analysis"
FALLBACK_MODEL = "gpt-4o-mini"
_UNSUPPORTED = ("minLength", "maxLength", "default")


@pytest.fixture(scope="module")
def second_server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def second(second_server: FakeOpenAIServer) -> FakeOpenAIServer:
    second_server.reset()
    return second_server


def _settings(
    database_url: str, temporal_address: str, fake: FakeOpenAIServer, **env: Any
) -> Settings:
    return make_settings(database_url, temporal_address, **fake_env(fake, **env))


def _objects(schema: Any) -> Iterator[dict[str, Any]]:
    """Every object schema inside `schema` ($defs and nested ones included)."""
    if isinstance(schema, dict):
        if schema.get("type") == "object" or "properties" in schema:
            yield schema
        for value in schema.values():
            yield from _objects(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _objects(value)


def _keys(schema: Any) -> set[str]:
    if isinstance(schema, dict):
        out = set()
        for k, v in schema.items():
            if k not in ("properties", "$defs"):
                out.add(k)
            else:
                for sub in v.values():
                    out |= _keys(sub)
                continue
            out |= _keys(v)
        return out
    if isinstance(schema, list):
        return set().union(*(_keys(v) for v in schema)) if schema else set()
    return set()


async def _view(settings: Settings, job_id: uuid.UUID) -> dict[str, Any]:
    async with api_client(settings) as (_, c):
        got = await c.get(f"/api/ai/jobs/{job_id}", headers=auth(settings, "u1"))
    assert got.status_code == 200, got.text
    body: dict[str, Any] = got.json()
    return body


async def _succeeded(stack: Stack, job_id: uuid.UUID) -> Any:
    row = await stack.wait_status(job_id, "succeeded", "failed", timeout=60)
    assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
    return row


async def test_deepseek_asks_json_object_and_a_json_schema_fallback_gets_the_strict_schema(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
    second: FakeOpenAIServer,
) -> None:
    chain = [
        {
            "model": FALLBACK_MODEL,
            "baseUrl": second.base_url,
            "apiKey": "sk-fallback-0000",
            "structuredOutput": "json_schema",
        }
    ]
    settings = _settings(
        database_url,
        temporal_address,
        fake,
        AI_FALLBACKS=json.dumps(chain),
        AI_MODEL="deepseek-chat",
    )
    step = {"kind": "valid", "content": SCRIPTED[FLASH]}
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        await fake.ascript([], default=step)
        answered = await stack.create(job_type=FLASH, input=INPUTS[FLASH])
        await _succeeded(stack, answered)
        assert [f["type"] for f in await fake.aforms()] == ["json_object"]
        assert (await _view(settings, answered))["result"]["structuredOutput"] == "json_object"

        await fake.ascript([], default={"kind": "status", "status": 503})
        await second.ascript([], default=step)
        moved = await stack.create(job_type=FLASH, input=INPUTS[FLASH])
        await _succeeded(stack, moved)
        [sent] = await second.aforms()
        assert sent["type"] == "json_schema"
        spec = sent["json_schema"]
        assert spec["strict"] is True
        assert 1 <= len(spec["name"]) <= 64 and spec["name"].replace("_", "").isalnum()
        schema = spec["schema"]
        assert "flashcards" in schema["properties"]
        assert not set(_UNSUPPORTED) & _keys(schema)
        objects = list(_objects(schema))
        assert len(objects) >= 2  # the deck and its card ($defs)
        for obj in objects:
            assert obj["additionalProperties"] is False
            assert sorted(obj["required"]) == sorted(obj["properties"])
        view = await _view(settings, moved)
        assert view["result"]["structuredOutput"] == "json_schema"
        assert view["result"]["model"] == FALLBACK_MODEL


async def test_a_refused_form_is_asked_again_at_once_and_every_later_job_asks_the_lower(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    settings = _settings(
        database_url,
        temporal_address,
        fake,
        AI_MODEL=FALLBACK_MODEL,
        AI_STRUCTURED_OUTPUT=json.dumps({FALLBACK_MODEL: "json_schema"}),
    )
    await fake.arefuse_forms("json_schema")
    await fake.ascript(
        [],
        default={"kind": "valid", "content": SCRIPTED[FLASH]},
        rules=[("learning coach", {"kind": "valid", "content": SCRIPTED[WEAK]})],
    )
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        first = await stack.create(job_type=FLASH, input=INPUTS[FLASH])
        row = await _succeeded(stack, first)
        assert row.attempt_count == 1  # asked again in the same attempt
        assert [f["type"] for f in await fake.aforms()] == ["json_schema", "json_object"]
        usage = await usage_rows(stack, first)
        assert [(u.attempt_no, u.error_code, u.structured_output) for u in usage] == [
            (1, "REQUEST_REJECTED", "json_schema"),
            (1, None, "json_object"),
        ]
        assert usage[0].cost_usd == 0  # a 400 read whole: nothing billed
        assert len({u.call_no for u in usage}) == 2
        async with stack.parts.sessionmaker() as s:
            stored = (await s.execute(text("SELECT * FROM ai_structured_downgrade"))).all()
        assert [(r.base_url, r.model, r.form) for r in stored] == [
            (fake.base_url, FALLBACK_MODEL, "json_object")
        ]
        assert (await _view(settings, first))["result"]["structuredOutput"] == "json_object"

    # Another process (a new gateway, nothing in memory) reads what the cluster learned.
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        weak = await stack.create(job_type=WEAK, input=INPUTS[WEAK])
        again = await stack.create(job_type=FLASH, input=INPUTS[FLASH])
        await _succeeded(stack, weak)
        await _succeeded(stack, again)
        assert [f["type"] for f in await fake.aforms()][2:] == ["json_object", "json_object"]


async def test_an_unset_model_and_a_configured_none(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    settings = _settings(
        database_url,
        temporal_address,
        fake,
        AI_MODEL="local-llm",
        AI_STRUCTURED_OUTPUT=json.dumps({"*": "none"}),
    )
    await fake.ascript([], default={"kind": "valid", "content": SCRIPTED[FLASH]})
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        job = await stack.create(job_type=FLASH, input=INPUTS[FLASH])
        await _succeeded(stack, job)
    assert [f["type"] for f in await fake.aforms()] == ["none"]


async def test_a_reused_job_shows_its_source_s_form(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    settings = _settings(database_url, temporal_address, fake, AI_MODEL="deepseek-chat")
    await fake.ascript([], default={"kind": "valid", "content": SCRIPTED[FLASH]})
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        source = await stack.create(job_type=FLASH, input=INPUTS[FLASH], reuse=True)
        await _succeeded(stack, source)
        reuser = await stack.create(job_type=FLASH, input=INPUTS[FLASH], reuse=True)
        row = await _succeeded(stack, reuser)
        assert row.reused_from_job_id == source
        assert (await fake.acalls())["count"] == 1
        view = await _view(settings, reuser)
        assert view["reusedFromJobId"] == str(source)
        assert view["result"]["structuredOutput"] == "json_object"
        assert view["result"]["model"] == "deepseek-chat"
