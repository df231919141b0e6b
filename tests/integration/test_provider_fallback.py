"""Provider fallback over real HTTP: the engine's primary is one fake OpenAI-compatible server,
its AI_FALLBACKS entry another on its own port. A health failure of the primary moves the call
to the fallback in the same attempt (the job type allows no retry, so only the move can save
it), priced at the fallback's price; a request's error, a user key's error and a user-key job
never reach the fallback; an open primary breaker sends calls straight to it.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text
from temporalio.client import Client

from db.session import SessionMaker
from engine.settings import Settings
from jobs.spec import Catalog
from jobs.types import quiz_generation as quiz
from providers.crypto import generate_key_setting
from providers.pricing import PriceTable
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import api_client, auth, fake_env, usage_rows
from tests.stack import JOB_QUEUES, catalog_with, engine_stack, make_settings, variant

QUIZ_ONCE = variant(quiz.JOB, "test_quiz_fallback", timeout_ms=5000, max_retries=0)
_ONE = variant(quiz.JOB, "test_quiz_one_model", timeout_ms=5000, max_retries=0)
# A type whose output must come from the one configured model.
QUIZ_ONE_MODEL = dataclasses.replace(
    _ONE, definition=_ONE.definition.model_copy(update={"fallback": "none"})
)
CATALOG: Catalog = catalog_with(QUIZ_ONCE, QUIZ_ONE_MODEL)
FALLBACK_MODEL = "gpt-4o-mini"
FALLBACK_KEY = "sk-fallback-test-key-1111"
INPUT = {"sourceText": "Ribosomes assemble proteins. Mitochondria make ATP.", "count": 1}
VALID = {
    "questions": [
        {
            "question": "What do ribosomes do?",
            "choices": ["Assemble proteins", "Produce ATP", "Store DNA", "Digest waste"],
            "answer_index": 0,
            "explanation": "The text says ribosomes assemble proteins.",
        }
    ]
}
VALID_STEP = {"kind": "valid", "content": VALID, "tokens_in": 120, "tokens_out": 80}


@pytest.fixture(scope="module")
def second_server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def second(second_server: FakeOpenAIServer) -> FakeOpenAIServer:
    second_server.reset()
    return second_server


@pytest.fixture
def make(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
    second: FakeOpenAIServer,
) -> Any:
    """(settings, stack) of an engine whose primary is `fake` (unless `env` says otherwise)
    and whose one fallback entry is `second`."""
    chain = [{"model": FALLBACK_MODEL, "baseUrl": second.base_url, "apiKey": FALLBACK_KEY}]

    def build(**env: Any) -> tuple[Settings, Any]:
        settings = make_settings(
            database_url,
            temporal_address,
            CREDENTIAL_ENCRYPTION_KEY=generate_key_setting("k1"),
            **fake_env(fake, AI_FALLBACKS=json.dumps(chain), **env),
        )
        stack = engine_stack(settings, temporal_client, catalog=CATALOG, queues=JOB_QUEUES)
        return settings, stack

    return build


def _moves(reason: str) -> float:
    labels = {"from_model": "deepseek-chat", "to_model": FALLBACK_MODEL, "reason": reason}
    return REGISTRY.get_sample_value("aijobs_provider_fallbacks_total", labels) or 0.0


async def _history(client: Client, workflow_id: str) -> bytes:
    events = [e async for e in client.get_workflow_handle(workflow_id).fetch_history_events()]
    return b"".join(e.SerializeToString() for e in events)


async def test_primary_503_succeeds_on_the_fallback_at_its_price(
    make: Any, fake: FakeOpenAIServer, second: FakeOpenAIServer, temporal_client: Client
) -> None:
    settings, stack_cm = make()
    await fake.ascript([], default={"kind": "status", "status": 503})
    await second.ascript([], default=VALID_STEP)
    before = _moves("5xx")
    async with stack_cm as stack:
        job_id = await stack.create(job_type="test_quiz_fallback", input=INPUT)
        row = await stack.wait_status(job_id, "succeeded", "failed")
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert row.output == VALID
        assert (await fake.acalls())["count"] == 1
        seen = await second.acalls()
        assert seen["authorizations"] == [f"Bearer {FALLBACK_KEY}"]
        assert seen["models"] == [FALLBACK_MODEL]
        usage = await usage_rows(stack, job_id)
        assert [(u.attempt_no, u.model, u.error_code) for u in usage] == [
            (1, "deepseek-chat", "PROVIDER_UNAVAILABLE"),
            (1, FALLBACK_MODEL, None),
        ]
        assert usage[0].cost_usd == 0  # an error answer read whole: what the provider said
        assert usage[1].cost_usd == PriceTable().call_cost(FALLBACK_MODEL, 120, 80)
        assert usage[1].priced_as == FALLBACK_MODEL
        assert len({u.call_no for u in usage}) == 2  # each call its own identity
        assert _moves("5xx") == before + 1
        history = await _history(temporal_client, row.workflow_id)
        assert f"deepseek-chat->{FALLBACK_MODEL}:5xx".encode() in history
        assert FALLBACK_KEY.encode() not in history
        described = await temporal_client.get_workflow_handle(row.workflow_id).describe()
        assert (await described.memo())["fallback"] == f"deepseek-chat->{FALLBACK_MODEL}:5xx"
        async with api_client(settings) as (_, c):
            view = await c.get(f"/api/ai/jobs/{job_id}", headers=auth(settings, "u1"))
        assert view.status_code == 200, view.text
        assert view.json()["result"]["model"] == FALLBACK_MODEL
        assert FALLBACK_KEY not in view.text


async def test_primary_400_fails_without_a_fallback_call(
    make: Any, fake: FakeOpenAIServer, second: FakeOpenAIServer
) -> None:
    _, stack_cm = make()
    await fake.ascript([], default={"kind": "status", "status": 400, "message": "bad field"})
    await second.ascript([], default=VALID_STEP)
    async with stack_cm as stack:
        job_id = await stack.create(job_type="test_quiz_fallback", input=INPUT)
        row = await stack.wait_status(job_id, "succeeded", "failed")
        assert (row.lifecycle_status, row.error_code) == ("failed", "REQUEST_REJECTED")
        assert (await second.acalls())["count"] == 0


async def test_a_type_that_opts_out_fails_on_its_one_model(
    make: Any, fake: FakeOpenAIServer, second: FakeOpenAIServer
) -> None:
    _, stack_cm = make()
    await fake.ascript([], default={"kind": "status", "status": 503})
    await second.ascript([], default=VALID_STEP)
    async with stack_cm as stack:
        job_id = await stack.create(job_type="test_quiz_one_model", input=INPUT)
        row = await stack.wait_status(job_id, "succeeded", "failed")
        assert (row.lifecycle_status, row.error_code) == ("failed", "PROVIDER_UNAVAILABLE")
        assert (await second.acalls())["count"] == 0


async def test_user_key_401_fails_without_a_fallback_call(
    make: Any, fake: FakeOpenAIServer, second: FakeOpenAIServer
) -> None:
    settings, stack_cm = make()
    await fake.ascript([], default={"kind": "status", "status": 401, "message": "bad key"})
    await second.ascript([], default=VALID_STEP)
    async with api_client(settings) as (_, c):
        added = await c.post(
            "/api/ai/credentials",
            json={"provider": "deepseek", "apiKey": "sk-user-own-key-2222"},
            headers=auth(settings, "u1"),
        )
        assert added.status_code == 201, added.text
    async with stack_cm as stack:
        job_id = await stack.create(
            job_type="test_quiz_fallback", input=INPUT, credential_mode="user_deepseek_key"
        )
        row = await stack.wait_status(job_id, "succeeded", "failed")
        assert (row.lifecycle_status, row.error_code) == ("failed", "CREDENTIAL_INVALID")
        assert (await fake.acalls())["authorizations"] == ["Bearer sk-user-own-key-2222"]
        assert (await second.acalls())["count"] == 0


async def test_open_primary_breaker_sends_calls_straight_to_the_fallback(
    make: Any, db: SessionMaker, fake: FakeOpenAIServer, second: FakeOpenAIServer
) -> None:
    _, stack_cm = make()
    await second.ascript([], default=VALID_STEP)
    async with db.begin() as s:
        await s.execute(
            text(
                "INSERT INTO provider_gate (provider, key_ref, consecutive_failures, open_until) "
                "VALUES ('openai_compatible', 'platform', 5, now() + interval '60 seconds')"
            )
        )
    before = _moves("breaker")
    async with stack_cm as stack:
        job_ids = [
            await stack.create(job_type="test_quiz_fallback", input=INPUT, target_id=f"t{i}")
            for i in range(2)
        ]
        for job_id in job_ids:
            row = await stack.wait_status(job_id, "succeeded", "failed", timeout=20)
            assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
            [u] = await usage_rows(stack, job_id)
            assert (u.model, u.error_code) == (FALLBACK_MODEL, None)
            assert u.cost_usd == PriceTable().call_cost(FALLBACK_MODEL, 120, 80) > Decimal(0)
        assert (await fake.acalls())["count"] == 0
        assert (await second.acalls())["count"] == 2
        assert _moves("breaker") == before + 2


async def test_a_primary_that_refuses_connections_moves_to_the_fallback(
    make: Any, second: FakeOpenAIServer
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    _, stack_cm = make(AI_BASE_URL=closed)
    await second.ascript([], default=VALID_STEP)
    async with stack_cm as stack:
        job_id = await stack.create(job_type="test_quiz_fallback", input=INPUT)
        row = await stack.wait_status(job_id, "succeeded", "failed")
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        usage = await usage_rows(stack, job_id)
        assert [(u.model, u.error_code) for u in usage] == [
            ("deepseek-chat", "PROVIDER_UNAVAILABLE"),
            (FALLBACK_MODEL, None),
        ]
        assert usage[0].cost_usd == 0  # never connected: nothing reached the provider
        assert (await second.acalls())["count"] == 1
