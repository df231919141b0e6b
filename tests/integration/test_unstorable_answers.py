"""An answer PostgreSQL cannot store is an invalid output, on the real stack against the fake
server over HTTP (jobs/output.py): a flashcard answer holding a NUL (`\\u0000`) fails its
attempt `VALIDATION_OUTPUT_INVALID`, charged, and the retry with its correction succeeds; one
whose every answer holds a lone surrogate fails the job with that code, every call charged.
Never an INTERNAL_* code, never a call without its usage row."""

from __future__ import annotations

import copy
import json
from typing import Any

from temporalio.client import Client

from db.session import SessionMaker
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import api_client, auth, fake_env, usage_rows
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, engine_stack, make_settings

TYPE = "flashcard_generation"
MARK = "SURROGATE-MARK"


def answer_with(front: str) -> dict[str, Any]:
    """A valid answer step whose second card's front is `front`, as raw answer text."""
    out = copy.deepcopy(SCRIPTED[TYPE])
    out["flashcards"][1]["front"] = "PLACEHOLDER"
    text = json.dumps(out).replace('"PLACEHOLDER"', front)
    return {"kind": "valid", "content_text": text, "tokens_in": 300, "tokens_out": 120}


async def test_an_answer_that_cannot_be_stored_is_invalid_and_every_call_is_charged(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    valid = {"kind": "valid", "content": SCRIPTED[TYPE], "tokens_in": 300, "tokens_out": 120}
    # The NUL as JSON writes it (an escape inside the answer's text); the surrogate raw, as a
    # provider's stream may carry it: both parse into strings PostgreSQL refuses.
    nul = answer_with('"a\\u0000b"')
    lone = answer_with('"x\ud800y"')
    settings = make_settings(database_url, temporal_address, **fake_env(fake))
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        await fake.ascript([nul], default=valid)
        first = await st.create(job_type=TYPE, input=INPUTS[TYPE])
        row = await st.wait_status(first, timeout=60)
        assert (row.lifecycle_status, row.attempt_count) == ("succeeded", 2), row.error_code
        await fake.ascript([], default=valid, rules=[(MARK, lone)])
        marked = {**INPUTS[TYPE], "sourceText": f"{MARK} {INPUTS[TYPE]['sourceText']}"}
        second = await st.create(job_type=TYPE, input=marked)
        row = await st.wait_status(second, timeout=90)
        assert (row.lifecycle_status, row.error_code) == ("failed", "VALIDATION_OUTPUT_INVALID")
        attempts = row.attempt_count
        assert attempts >= 2
        async with api_client(settings) as (_, c):
            headers = auth(settings, "u1")
            one = (await c.get(f"/api/ai/jobs/{first}/usage", headers=headers)).json()
            two = (await c.get(f"/api/ai/jobs/{second}/usage", headers=headers)).json()
        assert [a["errorCodes"] for a in one["attempts"]] == [["VALIDATION_OUTPUT_INVALID"], []]
        assert [len(a["providerCalls"]) for a in one["attempts"]] == [1, 1]
        assert [a["errorCodes"] for a in two["attempts"]] == [
            ["VALIDATION_OUTPUT_INVALID"]
        ] * attempts
        for job_id, calls in ((first, 2), (second, attempts)):
            rows = await usage_rows(st, job_id)
            assert len(rows) == calls and all(r.cost_usd > 0 for r in rows)
            assert sum(r.cost_usd for r in rows) == (await st.job(job_id)).spent_cost_usd
    assert (await fake.acalls())["count"] == 2 + attempts
    # The retry carried its correction.
    prompts = [m[-1]["content"] for m in await fake.amessages()]
    assert "previous answer was rejected" in prompts[1]
