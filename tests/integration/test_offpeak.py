"""The off-peak tier end to end (real PostgreSQL and Temporal, the fake OpenAI-compatible
server): a job waits `queued` on its workflow's timer until its provider's window opens, and its
call is charged at the window's price and says so; a deadline that comes before any window
fails the job (`then: "fail"`) or runs it at the standard price (`then: "standard"`); a cancel
ends the wait at once; a retry
after the window closed waits again, for its deadline here, and runs at the standard price."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from db.session import SessionMaker
from jobs.types import flashcard_generation
from providers.pricing import PriceTable
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.engine_helpers import wait_workflow_closed, workflow_canceller
from tests.integration.provider_helpers import fake_env, usage_rows
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, Stack, engine_stack, make_settings, variant
from tests.support import eventually

JOB_TYPE = "flashcard_generation"
CANCELED = WorkflowExecutionStatus.CANCELED
MODEL = "gpt-4o-mini"
TOKENS_IN, TOKENS_OUT = 1200, 800


def _window(start: datetime, end: datetime) -> str:
    span = {"start": start.strftime("%H:%M:%S"), "end": end.strftime("%H:%M:%S"), "price": 0.5}
    return json.dumps({"openai_compatible": [span]})


async def _answer(fake: FakeOpenAIServer) -> None:
    answer = {"kind": "valid", "content": SCRIPTED[JOB_TYPE]}
    await fake.ascript([], default={**answer, "tokens_in": TOKENS_IN, "tokens_out": TOKENS_OUT})


async def _create(stack: Stack, **kw: Any) -> uuid.UUID:
    return await stack.create(
        job_type=JOB_TYPE,
        target_type="lesson",
        target_id="L-1",
        input=INPUTS[JOB_TYPE],
        service_tier="offpeak",
        **kw,
    )


async def _held(client: Client, stack: Stack, job_id: uuid.UUID) -> None:
    """Until the job's workflow waits on its hold's timer (after RESOLVE)."""
    wid = (await stack.job(job_id)).workflow_id

    async def timer() -> bool:
        try:
            history = await client.get_workflow_handle(wid).fetch_history()
        except RPCError as err:  # not started by the relay yet
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            return False
        return any(e.event_type == EventType.EVENT_TYPE_TIMER_STARTED for e in history.events)

    await eventually(timer, timeout=15, interval=0.1, what=f"job {job_id} to wait on its timer")


async def test_an_offpeak_job_waits_queued_for_its_window_and_pays_its_price(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    await _answer(fake)
    now = datetime.now(UTC).replace(microsecond=0)
    opens = now + timedelta(seconds=6)
    env = fake_env(
        fake, AI_MODEL=MODEL, AI_OFFPEAK_WINDOWS=_window(opens, opens + timedelta(minutes=5))
    )
    settings = make_settings(database_url, temporal_address, **env)
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        job_id = await _create(stack)
        await _held(temporal_client, stack, job_id)
        assert datetime.now(UTC) < opens  # the timer is the window's, not a call's wait
        row = await stack.job(job_id)
        assert (row.lifecycle_status, row.progress, row.locked_by) == ("queued", 0, None)
        assert (await fake.acalls())["models"] == []
        row = await stack.wait_status(job_id, "succeeded", "failed", timeout=30)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        [u] = await usage_rows(stack, job_id)
    assert u.created_at >= opens and u.service_tier == "offpeak"
    half = PriceTable().call_cost(
        MODEL, TOKENS_IN, TOKENS_OUT, tier="offpeak", discount=Decimal("0.5")
    )
    assert u.cost_usd == half == PriceTable().call_cost(MODEL, TOKENS_IN, TOKENS_OUT) / 2


async def test_a_deadline_before_any_window_fails_or_runs_at_the_standard_price(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    await _answer(fake)
    now = datetime.now(UTC)
    later = now + timedelta(hours=6)  # the only window opens long after the deadlines
    env = fake_env(
        fake, AI_MODEL=MODEL, AI_OFFPEAK_WINDOWS=_window(later, later + timedelta(hours=1))
    )
    settings = make_settings(database_url, temporal_address, **env)
    deadline = now + timedelta(seconds=3)
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as stack:
        failed = await _create(stack, offpeak_deadline_at=deadline, offpeak_on_deadline="fail")
        ran = await _create(stack, offpeak_deadline_at=deadline, offpeak_on_deadline="standard")
        waiting = await _create(stack)  # its deadline a day away: cancelled while it waits
        await _held(temporal_client, stack, waiting)
        cancel = workflow_canceller(temporal_client)
        assert (await stack.service.cancel(waiting, "u1", cancel_workflow=cancel)).outcome == (
            "cancelled"
        )
        wid = (await stack.job(waiting)).workflow_id
        assert (await wait_workflow_closed(temporal_client, wid)).status == CANCELED
        f = await stack.wait_status(failed, timeout=30)
        r = await stack.wait_status(ran, timeout=30)
        assert (f.lifecycle_status, f.error_code) == ("failed", "OFFPEAK_DEADLINE_PASSED")
        assert f.public_error_message.startswith("The job's off-peak deadline passed")
        assert await usage_rows(stack, failed) == []
        assert r.lifecycle_status == "succeeded", (r.error_code, r.internal_error_message)
        [u] = await usage_rows(stack, ran)
    assert u.created_at >= deadline and u.service_tier == "standard"
    assert u.cost_usd == PriceTable().call_cost(MODEL, TOKENS_IN, TOKENS_OUT)
    assert (await fake.acalls())["models"] == [MODEL]  # the standard job's only


async def test_a_retry_after_the_window_closed_waits_again_within_the_deadline(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    """The first attempt runs in the window and fails; its retry (4 s later) finds the window
    closed, hands the workflow the wait to the deadline, and runs there at the standard price."""
    await fake.ascript(
        [{"kind": "status", "status": 500}],
        default={"kind": "valid", "content": SCRIPTED[JOB_TYPE], "tokens_in": TOKENS_IN},
    )
    now = datetime.now(UTC)
    closes = now + timedelta(seconds=3)
    env = fake_env(
        fake, AI_MODEL=MODEL, AI_OFFPEAK_WINDOWS=_window(now - timedelta(minutes=1), closes)
    )
    settings = make_settings(database_url, temporal_address, **env)
    slow_retry = variant(flashcard_generation.JOB, "flashcard_offpeak_retry", backoff_ms=4000)
    deadline = now + timedelta(seconds=8)
    async with engine_stack(
        settings, temporal_client, queues=JOB_QUEUES, extra_types=[slow_retry]
    ) as stack:
        job_id = await stack.create(
            job_type="flashcard_offpeak_retry",
            target_type="lesson",
            target_id="L-1",
            input=INPUTS[JOB_TYPE],
            service_tier="offpeak",
            offpeak_deadline_at=deadline,
            offpeak_on_deadline="standard",
        )
        row = await stack.wait_status(job_id, timeout=30)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        first, second = await usage_rows(stack, job_id)
    assert (first.error_code, first.service_tier) == ("PROVIDER_UNAVAILABLE", "offpeak")
    assert first.created_at < closes
    assert (second.attempt_no, second.error_code, second.service_tier) == (2, None, "standard")
    assert second.created_at >= deadline
