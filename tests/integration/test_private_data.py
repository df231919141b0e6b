"""Private data: prompts are built from what the user wrote, outputs are redacted for job types
that ask, and one retention rule removes every copy of a job's input and output."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from sqlalchemy import text
from temporalio.client import Client

from activities.reconciler import Reconciler
from db.session import SessionMaker
from engine.errors import JobNotRetryable
from engine.settings import Settings
from runtime.wiring import reconciler_config
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.engine_helpers import scripted_job_type
from tests.integration.provider_helpers import fake_env, user_prompts
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import JOB_QUEUES, engine_stack, make_settings

PHONE_LIKE = "Order 5551234 shipped to ada@example.com."


async def test_the_prompt_keeps_what_the_user_wrote(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    """The prompt keeps what the user wrote, but for what the type's PII masking replaces: the
    e-mail address goes as a placeholder (never as itself, nor as "[email]"), and a 7-digit
    number that is no phone number of the region goes as written."""
    await fake.ascript([{"kind": "valid", "content": SCRIPTED["quiz_generation"]}])
    settings = make_settings(database_url, temporal_address, **fake_env(fake))
    source = f"{INPUTS['quiz_generation']['sourceText']} {PHONE_LIKE}"
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        job = await st.create(
            job_type="quiz_generation",
            target_type="lesson",
            target_id="L-1",
            input={**INPUTS["quiz_generation"], "sourceText": source},
        )
        row = await st.wait_status(job, timeout=30)
        assert row.lifecycle_status == "succeeded", row.internal_error_message
    [prompt] = await user_prompts(fake)
    assert "Order 5551234 shipped to <EMAIL_1>." in prompt
    assert "ada@example.com" not in prompt
    assert "[phone]" not in prompt and "[email]" not in prompt


async def test_an_input_at_its_length_limit_still_runs(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
    fake: FakeOpenAIServer,
) -> None:
    """Redaction can lengthen text ("a@b.co" → "[email]"); a valid input at its exact limit
    must not then fail validation inside the job."""
    await fake.ascript([{"kind": "valid", "content": SCRIPTED["quiz_generation"]}])
    settings = make_settings(database_url, temporal_address, **fake_env(fake))
    filler = "a@b.co " * 2857  # 19,999 characters of e-mail addresses
    source = (filler + "x" * 20_000)[:20_000]
    async with engine_stack(settings, temporal_client, queues=JOB_QUEUES) as st:
        job = await st.create(
            job_type="quiz_generation",
            target_type="lesson",
            target_id="L-1",
            input={**INPUTS["quiz_generation"], "sourceText": source},
        )
        row = await st.wait_status(job, timeout=30)
        assert (row.lifecycle_status, row.error_code) == ("succeeded", None)


async def test_output_redaction_masks_the_stored_output(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    base = scripted_job_type("redacting_synthetic")
    d = base.definition
    redacting = dataclasses.replace(
        base,
        definition=d.model_copy(
            update={"security": d.security.model_copy(update={"output_redaction": True})}
        ),
    )
    async with engine_stack(settings, temporal_client, extra_types=[redacting]) as st:
        plain = await st.create(input={"echo": {"contact": "ada@example.com"}})
        masked = await st.create(
            job_type="redacting_synthetic", input={"echo": {"contact": "ada@example.com"}}
        )
        plain_row = await st.wait_status(plain, "succeeded")
        masked_row = await st.wait_status(masked, "succeeded")
    assert "ada@example.com" in str(plain_row.output)
    assert "ada@example.com" not in str(masked_row.output)
    assert "[email]" in str(masked_row.output)


async def test_retention_removes_every_copy_of_private_data(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    secret = f"PRIVATE-{uuid.uuid4().hex}"
    slow = scripted_job_type("slow_synthetic", timeout_ms=600_000)
    # A short SQL lock: EXECUTE sees the cancel below when it extends the lock, every half TTL
    # (the queue's 30 s lock made the test wait 15 s for it).
    async with engine_stack(
        settings, temporal_client, extra_types=[slow], engine_overrides={"lock_ttl_s": 4}
    ) as st:
        old_done = await st.create(input={"echo": {"s": secret}, "failTimes": 9})
        old_waiting = await st.create(
            job_type="slow_synthetic", input={"echo": {"s": secret}, "delayMs": 600_000}
        )
        fresh = await st.create(input={"echo": {"s": secret}})
        await st.wait_status(old_done, "failed", timeout=60)
        await st.wait_status(old_waiting, "running")
        await st.wait_status(fresh, "succeeded")
        async with db.begin() as s:
            await s.execute(
                text(
                    "UPDATE ai_job SET created_at = now() - interval '31 days' WHERE id = ANY(:ids)"
                ),
                {"ids": [old_done, old_waiting]},
            )
            await s.execute(
                text(
                    "UPDATE ai_job_snapshot SET expires_at = now() - interval '1 second' "
                    "WHERE job_id = :j"
                ),
                {"j": old_done},
            )
        cfg = dataclasses.replace(reconciler_config(st.settings), retention_days=30)
        result = await Reconciler(db, temporal_client, cfg).run_once()
        assert result.private_data_purged == 1  # the running job keeps what it needs
        assert result.snapshots_deleted == 1

        async with db() as s:
            rows = {
                r.id: r
                for r in await s.execute(
                    text(
                        "SELECT id, input, output, private_data_purged_at, "
                        "(SELECT count(*) FROM ai_job_snapshot n WHERE n.job_id = j.id) AS snaps "
                        "FROM ai_job j"
                    )
                )
            }
        assert rows[old_done].input == {} and rows[old_done].output is None
        assert rows[old_done].private_data_purged_at is not None and rows[old_done].snaps == 0
        assert secret in str(rows[old_waiting].input)
        assert secret in str(rows[fresh].input) and secret in str(rows[fresh].output)
        # A purged job cannot be retried: its input is gone.
        with pytest.raises(JobNotRetryable):
            await st.service.retry(old_done)
        # The retry of a job that still has its input is one job, whoever asks twice.
        await st.service.cancel(old_waiting, "u1", admin=True)
        await st.wait_status(old_waiting, "cancelled", timeout=30)
        first = await st.service.retry(old_waiting)
        again = await st.service.retry(old_waiting)
        assert first.created and not again.created and first.job.id == again.job.id


async def test_a_user_cannot_claim_the_admin_retry_in_advance(
    db: SessionMaker, settings: Settings, temporal_client: Client
) -> None:
    async with engine_stack(settings, temporal_client) as st:
        original = await st.create(input={"failTimes": 9})
        await st.wait_status(original, "failed", timeout=60)
        # The old retry key was "retry-of:<id>" on the owner's own key space.
        squatter = await st.create(idempotency_key=f"retry-of:{original}", input={"echo": {"n": 1}})
        retried = await st.service.retry(original)
        assert retried.created and retried.job.id != squatter
        assert retried.job.retried_from_job_id == original
