"""A worker SIGKILLed during a provider call: its call is charged all the same.

The provider (the scripted OpenAI-compatible server, over real HTTP) holds a flashcard call
before any byte of its answer; the `ai-interactive` worker process making it is killed, and a
new one started. The job succeeds once, with one answer's artifacts, and its usage lists both
calls the provider received: the killed one under its own attempt, `estimated` at the quote's
`worstCaseCostUsd` (its "call sent" mark, db/call_marks.py, charged by the next attempt's take
before that attempt's admission), the answered one under the next attempt, `reported`.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import tempfile
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from db.session import SessionMaker
from engine.scopes import JobScopes
from jobs import attempt_start, lifecycle
from jobs.admission import Refused
from jobs.requests import CreateJobRequest
from runtime.wiring import engine_config, gateway
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.engine_helpers import (
    rows,
    scalar,
    start_worker,
    wait_activity_started,
    worker_processes,
)
from tests.integration.provider_helpers import api_client, auth, fake_env
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import engine_stack, make_settings
from tests.support import eventually

pytestmark = pytest.mark.slow

CARDS = "flashcard_generation"
BODY = {"jobType": CARDS, "targetType": "lesson", "targetId": "L1", "input": INPUTS[CARDS]}


async def test_a_call_whose_worker_is_killed_is_charged_its_worst_case(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    # The first call is held (no byte answered) far longer than the test; the retry answers.
    await fake.ascript(
        [{"kind": "slow", "delay_s": 120, "content": SCRIPTED[CARDS]}],
        default={"kind": "valid", "content": SCRIPTED[CARDS]},
    )
    overrides = fake_env(fake, AI_HEARTBEAT_TIMEOUT_MS=2000)
    settings = make_settings(database_url, temporal_address, **overrides)
    env = {
        **os.environ,
        **{k: str(v) for k, v in overrides.items()},
        "DATABASE_URL": database_url,
        "TEMPORAL_ADDRESS": temporal_address,
        "TASK_QUEUE_SUFFIX": settings.task_queue_suffix,
        "AIJOBS_ENV": "test",
        "LOG_LEVEL": "WARNING",
    }
    logs = tempfile.TemporaryDirectory(prefix="aijobs-killed-call-")
    log = Path(logs.name) / "workers.log"
    headers = auth(settings, "u1")
    async with (
        engine_stack(settings, temporal_client, queues=()) as st,  # the relay; workers below
        api_client(settings) as (_, http),
    ):
        quote = await http.post("/api/ai/jobs/quote", json=BODY, headers=headers)
        assert quote.status_code == 200, quote.text
        worst = Decimal(str(quote.json()["worstCaseCostUsd"]))
        with logs, worker_processes() as ps:
            ps.append(start_worker(env, log))
            created = await http.post("/api/ai/jobs", json=BODY, headers=headers)
            assert created.status_code == 202, created.text
            job_id = uuid.UUID(created.json()["jobId"])

            async def held() -> bool:
                return bool((await fake.acalls())["count"] >= 1)

            await eventually(held, timeout=60, what="the provider to hold the first call")
            wid = (await st.job(job_id)).workflow_id
            await wait_activity_started(temporal_client, wid, "execute")
            ps[0].kill()  # SIGKILL while the provider holds the call
            assert ps[0].wait(timeout=10) == -signal.SIGKILL
            ps.append(start_worker(env, log))

            row = await st.wait_status(job_id, timeout=120)
            assert row.lifecycle_status == "succeeded", (
                row.error_code,
                row.internal_error_message,
                log.read_text()[-3000:],
            )
        usage = await http.get(f"/api/ai/jobs/{job_id}/usage", headers=headers)
        artifacts = await http.get(f"/api/ai/jobs/{job_id}/artifacts", headers=headers)
    assert (await fake.acalls())["count"] == 2  # the provider received (and bills) two calls

    # Ended once, with one answer's artifacts.
    assert len(artifacts.json()["items"]) == len(SCRIPTED[CARDS]["flashcards"])
    assert await scalar(db, "SELECT count(*) FROM ai_call_mark WHERE job_id = :j", j=job_id) == 0
    logged = await rows(
        db,
        "SELECT attempt_no, call_no, cost_basis, cost_usd, error_code FROM ai_usage_log "
        "WHERE job_id = :j ORDER BY call_no",
        j=job_id,
    )
    killed, answered = logged
    assert (killed.cost_basis, killed.cost_usd, killed.error_code) == (
        "estimated",
        worst,
        "INTERNAL_WORKER_LOST",
    )
    assert (answered.cost_basis, answered.error_code) == ("reported", None)
    assert killed.attempt_no != answered.attempt_no
    assert row.spent_cost_usd == killed.cost_usd + answered.cost_usd

    # The usage route lists both, each under its attempt.
    body: dict[str, Any] = usage.json()
    calls = {
        a["attempt"]: [(c["costBasis"], Decimal(str(c["costUsd"]))) for c in a["providerCalls"]]
        for a in body["attempts"]
    }
    assert calls[killed.attempt_no] == [("estimated", worst)], body
    assert [b for b, _ in calls[answered.attempt_no]] == ["reported"], body


async def test_a_dead_call_counts_before_the_next_call_is_covered(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    """A job capped at one call's worst case: its first attempt commits its take with the call's
    mark, and its worker dies before settling. The next attempt's take charges the dead call
    first, so the cost cover refuses a second call (the cap would be passed); the refusal rolls
    that transaction back, and the job's failed ending charges the call instead. Spent is the
    cap, never more: killing workers never spends past a limit."""
    settings = make_settings(database_url, temporal_address, **fake_env(fake))
    async with engine_stack(settings, temporal_client, queues=(), relay=False) as st:
        req = CreateJobRequest(
            user_id="u1",
            job_type=CARDS,
            target_type="lesson",
            target_id="L1",
            input=INPUTS[CARDS],
            # Whose money beyond the user's: the dead call counts in their budgets too.
            scopes=JobScopes(org_id="acme", team_ids=("red",), tags=("q4",)),
        )
        worst = (await st.service.quote(req)).checked.estimate.worst_case_cost_usd
        job = (await st.service.create(dataclasses.replace(req, max_cost_usd=worst))).job.id
        gw, cfg = gateway(settings), engine_config(settings)

        def attempt(n: int) -> attempt_start.Start:
            wid = f"ai-interactive:{CARDS}:{job}"
            return attempt_start.Start(job, wid, "test-worker", 60, "run-1", None, n, 30_000)

        async with db.begin() as s:  # attempt 1's first transaction: its call is marked sent
            first = await attempt_start.start(s, gw, st.parts.catalog, cfg, attempt(1))
        assert isinstance(first, attempt_start.Started)
        marks = "SELECT count(*) FROM ai_call_mark WHERE job_id = :j"
        assert await scalar(db, marks, j=job) == 1

        class _RolledBack(Exception):
            pass

        with pytest.raises(_RolledBack):
            async with db.begin() as s:  # attempt 2: its take charges the dead call first
                second = await attempt_start.start(s, gw, st.parts.catalog, cfg, attempt(2))
                assert isinstance(second, Refused) and second.limit == "cap", second
                raise _RolledBack  # as EXECUTE rolls a refusal back
        assert await scalar(db, marks, j=job) == 1

        async with db.begin() as s:  # the finalizer's ending
            await lifecycle.finalize_failed(
                s, job, code="BUDGET_EXHAUSTED", owner=f"ai-interactive:{CARDS}:{job}", identity="t"
            )
        row = await st.job(job)
    assert (row.lifecycle_status, row.error_code) == ("failed", "BUDGET_EXHAUSTED")
    assert await scalar(db, marks, j=job) == 0
    charged = await rows(
        db, "SELECT attempt_no, cost_basis, cost_usd FROM ai_usage_log WHERE job_id = :j", j=job
    )
    assert [(c.attempt_no, c.cost_basis, c.cost_usd) for c in charged] == [(1, "estimated", worst)]
    assert row.spent_cost_usd == worst == row.max_cost_usd
    scopes = await rows(
        db, "SELECT scope, scope_id, calls, cost_usd FROM ai_scope_usage_daily ORDER BY 1"
    )
    assert [(r.scope, r.scope_id, r.calls, r.cost_usd) for r in scopes] == [
        ("org", "acme", 1, worst),
        ("tag", "q4", 1, worst),
        ("team", "red", 1, worst),
    ]
    rolled = "SELECT calls, cost_usd, estimated_cost_usd, org_id FROM ai_usage_scoped_daily"
    assert [tuple(r) for r in await rows(db, rolled)] == [(1, worst, worst, "acme")]
    assert (await fake.acalls())["count"] == 0  # no call was sent in this test
