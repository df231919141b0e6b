"""Retention with the shortest setting (1 day) for every kind of row the engine keeps: a row
just past it goes, a fresh one stays. The private data of an ended job goes whole (input,
output, its business rows, chunk outputs, snapshot, internal error message), its lifecycle row
and usage stay."""

from __future__ import annotations

import uuid

from activities.retention import RetentionConfig, run_retention
from db.session import SessionMaker
from tests.integration.engine_helpers import execute, insert_job, rows, scalar

SHORTEST = RetentionConfig(
    data_days=1,
    outbox_days=1,
    audit_days=1,
    usage_days=1,
    provider_limit_days=1,
    provider_gate_days=1,
    lease_days=1,
    outbox_parked_days=1,
    revoked_key_days=1,
)
OLD = "now() - interval '2 days'"
SECRET = "retention-sentinel"


async def ended_job(db: SessionMaker, *, old: bool, status: str = "failed") -> uuid.UUID:
    """A job that ran a long source: chunk outputs, an internal error, a snapshot."""
    job = await insert_job(db)
    await execute(
        db,
        "UPDATE ai_job SET lifecycle_status = 'running', status = 'processing' WHERE id = :j",
        j=job,
    )
    await execute(
        db,
        "UPDATE ai_job SET lifecycle_status = CAST(:st AS text), status = 'failed', "
        "finished_at = now(), input = CAST(:doc AS jsonb), output = CAST(:doc AS jsonb), "
        "internal_error_message = :secret, correction_hint = :secret, chunk_count = 2, "
        f"created_at = {OLD if old else 'now()'} WHERE id = :j",
        j=job,
        st=status,
        doc=f'{{"s": "{SECRET}"}}',
        secret=SECRET,
    )
    for n in (0, 1):
        await execute(
            db,
            "INSERT INTO ai_job_chunk (job_id, chunk_no, start_char, end_char, input_tokens, "
            "item_count, status, output) VALUES (:j, :n, 0, 1, 1, 1, 'succeeded', "
            "CAST(:doc AS jsonb))",
            j=job,
            n=n,
            doc=f'{{"items": ["{SECRET}"]}}',
        )
    await execute(
        db,
        "INSERT INTO ai_job_snapshot (job_id, content, redaction_version, expires_at) "
        "VALUES (:j, CAST(:doc AS jsonb), 'v1', now() + interval '30 days')",
        j=job,
        doc=f'{{"s": "{SECRET}"}}',
    )
    await execute(
        db,
        "INSERT INTO ai_job_stream_item (job_id, attempt_no, ordinal, content) "
        "VALUES (:j, 1, 0, CAST(:doc AS jsonb))",
        j=job,
        doc=f'{{"s": "{SECRET}"}}',
    )
    batch = uuid.uuid4()
    await execute(
        db,
        "INSERT INTO ai_batch (id, provider, model, key_ref, task_queue, status, workflow_id) "
        "VALUES (:b, 'p', 'm', 'platform', 'q', 'completed', :w)",
        b=batch,
        w=f"ai-batch:{batch}",
    )
    await execute(
        db,
        "INSERT INTO ai_batch_item (id, batch_id, job_id, attempt, custom_id, status, body, "
        "response) VALUES (:i, :b, :j, 1, :c, 'succeeded', CAST(:doc AS jsonb), "
        "CAST(:doc AS jsonb))",
        i=uuid.uuid4(),
        b=batch,
        j=job,
        c=f"job-{job}-a1",
        doc=f'{{"s": "{SECRET}"}}',
    )
    await execute(
        db,
        "INSERT INTO ai_usage_log (job_id, user_id, attempt_no, credential_mode, provider, "
        "model) VALUES (:j, 'u1', 1, 'platform_key', 'synthetic', 'm')",
        j=job,
    )
    # The business rows a projector wrote from its output: content too.
    targeted = "id, job_id, user_id, ordinal, target_type, target_id"
    for sql in (
        f"INSERT INTO flashcard ({targeted}, front, back) "
        "VALUES (:i, :j, 'u1', 0, 't', '1', :secret, :secret)",
        f"INSERT INTO quiz_question ({targeted}, question, choices, answer_index, explanation, "
        "difficulty) VALUES (:i, :j, 'u1', 0, 't', '1', :secret, CAST('[\"a\"]' AS jsonb), 0, "
        ":secret, 'easy')",
        "INSERT INTO weak_point_candidate (id, job_id, user_id, ordinal, topic, evidence, "
        "recommended_action) VALUES (:i, :j, 'u1', 0, :secret, CAST('[]' AS jsonb), :secret)",
    ):
        await execute(db, sql, i=uuid.uuid4(), j=job, secret=SECRET)
    return job


BUSINESS_ROWS = (
    "SELECT (SELECT count(*) FROM flashcard WHERE job_id = :j) "
    "+ (SELECT count(*) FROM quiz_question WHERE job_id = :j) "
    "+ (SELECT count(*) FROM weak_point_candidate WHERE job_id = :j)"
)


async def test_an_ended_jobs_private_data_goes_whole_and_its_row_and_usage_stay(
    db: SessionMaker,
) -> None:
    old, fresh = await ended_job(db, old=True), await ended_job(db, old=False)
    running = await insert_job(db)
    await execute(db, f"UPDATE ai_job SET created_at = {OLD} WHERE id = :j", j=running)

    counts = await run_retention(db, SHORTEST)
    assert counts["private_data_purged"] == 1

    (row,) = await rows(
        db,
        "SELECT input, output, internal_error_message, correction_hint, lifecycle_status, "
        "error_code, private_data_purged_at FROM ai_job WHERE id = :j",
        j=old,
    )
    assert (row.input, row.output, row.internal_error_message, row.correction_hint) == (
        {},
        None,
        None,
        None,
    )
    assert row.lifecycle_status == "failed" and row.private_data_purged_at is not None
    chunk_outputs = await rows(db, "SELECT output FROM ai_job_chunk WHERE job_id = :j", j=old)
    assert [c.output for c in chunk_outputs] == [None, None]
    assert await scalar(db, "SELECT count(*) FROM ai_job_snapshot WHERE job_id = :j", j=old) == 0
    streamed = "SELECT count(*) FROM ai_job_stream_item WHERE job_id = :j"
    assert await scalar(db, streamed, j=old) == 0
    assert await scalar(db, streamed, j=fresh) == 1
    # A batch job's request line and its answer are job content too; the item row stays.
    batch_content = "SELECT concat(body::text, response::text) FROM ai_batch_item WHERE job_id = :j"
    assert await scalar(db, batch_content, j=old) == "{}"
    assert SECRET in str(await scalar(db, batch_content, j=fresh))
    assert await scalar(db, "SELECT count(*) FROM ai_usage_log WHERE job_id = :j", j=old) == 1
    # Its quiz questions, flashcards and weak-point candidates are gone; the fresh job's stay.
    assert await scalar(db, BUSINESS_ROWS, j=old) == 0
    assert await scalar(db, BUSINESS_ROWS, j=fresh) == 3
    every_copy = await scalar(
        db,
        "SELECT concat(j.input, j.output, j.internal_error_message, "
        "(SELECT string_agg(c.output::text, '') FROM ai_job_chunk c WHERE c.job_id = j.id), "
        "(SELECT n.content::text FROM ai_job_snapshot n WHERE n.job_id = j.id)) "
        "FROM ai_job j WHERE j.id = :j",
        j=old,
    )
    assert SECRET not in every_copy
    # A fresh ended job and an old one that has not ended keep theirs.
    assert SECRET in str(await scalar(db, "SELECT output FROM ai_job WHERE id = :j", j=fresh))
    assert await scalar(
        db, "SELECT private_data_purged_at IS NULL FROM ai_job WHERE id = :j", j=running
    )
    # Idempotent: the next pass finds nothing left to purge.
    assert (await run_retention(db, SHORTEST))["private_data_purged"] == 0


async def test_every_bookkeeping_kind_goes_after_its_retention(db: SessionMaker) -> None:
    job = await insert_job(db)
    for age in (OLD, "now()"):
        await execute(
            db,
            "INSERT INTO ai_usage_log (job_id, user_id, attempt_no, credential_mode, provider, "
            f"model, created_at) VALUES (:j, 'u1', 1, 'platform_key', 'p', 'm', {age}) "
            "ON CONFLICT DO NOTHING",
            j=job,
        )
        tag = "old" if age == OLD else "new"
        await execute(
            db,
            "INSERT INTO provider_limit (provider, model, key_ref, requests_available, "
            f"tokens_available, refilled_at) VALUES ('p', :m, 'platform', 1, 1, {age})",
            m=tag,
        )
        await execute(
            db,
            f"INSERT INTO provider_gate (provider, key_ref, paused_until) VALUES ('p', :k, {age})",
            k=tag,
        )
        await execute(
            db,
            "INSERT INTO provider_call_lease (id, provider, model, key_ref, job_id, expires_at) "
            f"VALUES (:id, 'p', 'm', 'platform', :j, {age})",
            id=uuid.uuid4(),
            j=job,
        )
        for status in ("dead", "failed"):
            await execute(
                db,
                "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, "
                f"payload, status, available_at) VALUES ('ai.job.enqueue', 'AiJob', :a, :d, "
                f"'{{}}'::jsonb, :st, {age})",
                a=str(uuid.uuid4()),
                d=f"retention:{uuid.uuid4()}",
                st=status,
            )
        await execute(
            db,
            "INSERT INTO user_model_credential (id, user_id, provider, key_id, ciphertext, "
            f"key_hint, revoked_at) VALUES (:id, 'u1', 'deepseek', 'k1', :c, '…1234', {age})",
            id=uuid.uuid4(),
            c=b"sealed",
        )
    # The daily rollup: a day of an earlier month goes, today's stays.
    await execute(
        db,
        "INSERT INTO ai_usage_daily (day, user_id, job_type, model, credential_mode) VALUES "
        "((now() - interval '40 days')::date, 'u1', 'synthetic', 'm', 'platform_key'), "
        "(now()::date, 'u1', 'synthetic', 'm', 'platform_key')",
    )
    # So do the rollups by scope and the budget alerts sent.
    for sql in (
        "INSERT INTO ai_scope_usage_daily (scope, scope_id, day) VALUES "
        "('team', 't', (now() - interval '40 days')::date), ('team', 't', now()::date)",
        "INSERT INTO ai_usage_scoped_daily (day, user_id, job_type, model, credential_mode, "
        "scope_key) VALUES ((now() - interval '40 days')::date, 'u1', 'synthetic', 'm', "
        "'platform_key', 'k')",
        "INSERT INTO ai_budget_alert (scope, scope_id, period, period_start, threshold, "
        "spent_usd) VALUES ('team', 't', 'day', (now() - interval '40 days')::date, 0.5, 1)",
    ):
        await execute(db, sql)
    # A revoked key a job still names keeps its row, its ciphertext erased.
    named = uuid.uuid4()
    await execute(
        db,
        "INSERT INTO user_model_credential (id, user_id, provider, key_id, ciphertext, key_hint, "
        f"revoked_at) VALUES (:id, 'u1', 'deepseek', 'k1', :c, '…9999', {OLD})",
        id=named,
        c=b"sealed",
    )
    await execute(db, "UPDATE ai_job SET credential_id = :c WHERE id = :j", c=named, j=job)

    counts = await run_retention(db, SHORTEST)

    assert counts["usage_deleted"] == 5  # one call row, one day of each rollup, one alert
    assert await scalar(db, "SELECT count(*) FROM ai_usage_log") == 1
    assert await scalar(db, "SELECT count(*) FROM ai_usage_daily WHERE day = now()::date") == 1
    assert await scalar(db, "SELECT count(*) FROM ai_scope_usage_daily") == 1  # today's
    assert counts["provider_limits_deleted"] == 1
    assert [r.model for r in await rows(db, "SELECT model FROM provider_limit")] == ["new"]
    assert counts["provider_gates_deleted"] == 1
    assert [r.key_ref for r in await rows(db, "SELECT key_ref FROM provider_gate")] == ["new"]
    assert counts["leases_deleted"] == 1
    assert await scalar(db, "SELECT count(*) FROM provider_call_lease") == 1
    assert counts["outbox_parked_deleted"] == 2
    assert (
        await scalar(db, "SELECT count(*) FROM outbox_event WHERE status IN ('dead', 'failed')")
        == 2
    )
    assert counts["revoked_keys_purged"] == 2  # one deleted, one erased
    keys = await rows(db, "SELECT id, length(ciphertext) AS n FROM user_model_credential")
    assert sorted(r.n for r in keys) == [0, 6] and {r.id: r.n for r in keys}[named] == 0


def test_the_purge_knows_every_business_table() -> None:
    """Every table shaped like a projector's (one row per job and ordinal, with its owner) is
    purged: a job type's new table is covered without an edit of the purge."""
    from db.models import Base
    from db.retention import PROJECTED_TABLES

    shaped = {
        t.name
        for t in Base.metadata.tables.values()
        if {"job_id", "user_id", "ordinal"} <= set(t.c.keys()) and not t.name.startswith("ai_")
    }
    assert shaped and set(PROJECTED_TABLES) == shaped


async def test_a_schedules_recorded_runs_go_after_data_retention_days(db: SessionMaker) -> None:
    schedule = uuid.uuid4()
    await execute(
        db,
        "INSERT INTO ai_schedule (id, user_id, job_type, target_type, target_id, input, "
        "interval_s) VALUES (:s, 'u1', 'synthetic', 'schedule', 't', '{}'::jsonb, 60)",
        s=schedule,
    )
    for age, at in ((OLD, "now() - interval '3 days'"), ("now()", "now()")):
        await execute(
            db,
            "INSERT INTO ai_schedule_run (schedule_id, scheduled_at, error_code, created_at) "
            f"VALUES (:s, {at}, 'RATE_LIMITED', {age})",
            s=schedule,
        )
    # Kept while younger than DATA_RETENTION_DAYS.
    assert (await run_retention(db, RetentionConfig(data_days=30)))["schedule_runs_deleted"] == 0
    assert (await run_retention(db, SHORTEST))["schedule_runs_deleted"] == 1
    left = await rows(
        db, "SELECT created_at > now() - interval '1 day' AS fresh FROM ai_schedule_run"
    )
    assert [r.fresh for r in left] == [True]
