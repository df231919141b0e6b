"""SUPER_ADMIN's view of an internal failure: `internalErrorMessage` carries the exception's
type, its message and the engine's own frames (`file:line in function`, bounded), never job
data; the worker's log carries the full traceback, never the exception's message. A sentinel in
the job's input must appear in neither."""

from __future__ import annotations

import dataclasses
import logging
import re
import uuid
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import text
from temporalio.client import Client

from activities.failures import (
    INTERNAL_MESSAGE_MAX_CHARS,
    STACK_MAX_FRAMES,
    WITHHELD,
    internal_message,
)
from db.session import SessionMaker
from engine.settings import Settings
from jobs.spec import Projection, ProjectionContext
from tests.integration.engine_helpers import scripted_job_type
from tests.integration.provider_helpers import api_client, auth
from tests.stack import engine_stack

FRAME = re.compile(
    r"^  (activities|api|db|engine|jobs|providers|runtime|workflows)/\S+\.py:\d+ in \w+$"
)


def sentinel() -> str:
    return f"SENTINEL-{uuid.uuid4().hex}"


def frames_of(message: str) -> list[str]:
    return [line for line in message.splitlines() if FRAME.match(line)]


# ---- the message itself (no engine) ----------------------------------------------------------


def _recurse(n: int) -> None:
    if n == 0:
        raise ValueError("x" * 10_000)
    _recurse(n - 1)


def test_the_message_is_bounded_and_names_only_engine_frames() -> None:
    try:
        _recurse(200)
    except ValueError as exc:
        message = internal_message(exc, context="where")
    assert message.startswith("where: ValueError: ")
    assert len(message) <= INTERNAL_MESSAGE_MAX_CHARS
    # This test module is not the engine's code: none of its 201 frames is listed.
    assert "tests/" not in message and frames_of(message) == []


def test_a_message_quoting_private_data_is_withheld() -> None:
    secret = sentinel()
    for raised in (
        RuntimeError(f"bad value {secret}"),
        RuntimeError(f"bad value {secret[3:20]}"),  # a slice of it quotes it too
    ):
        message = internal_message(raised, private=[secret, "short"])
        assert WITHHELD in message and secret[3:15] not in message
    kept = internal_message(KeyError("template_field"), private=[secret])
    assert "template_field" in kept


# ---- on the real engine ---------------------------------------------------------------------


async def test_the_admin_sees_the_stack_of_an_internal_failure_without_job_data(
    db: SessionMaker,
    settings: Settings,
    temporal_client: Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = sentinel()

    def leaky_prompt(inp: Any) -> Any:
        raise RuntimeError(f"cannot build a prompt from {inp.echo}")

    def driver_error(ctx: ProjectionContext, out: BaseModel) -> Projection:
        # The driver's message repeats the value: "invalid input syntax for type uuid: ...".
        return Projection([(text("SELECT CAST(:v AS uuid)"), {"v": secret})], [])

    prompt_bug = dataclasses.replace(
        scripted_job_type("t_prompt_bug", max_retries=0), build_prompt=leaky_prompt
    )
    projection_bug = scripted_job_type("t_projection_bug", max_retries=0, projection=driver_error)
    types = [prompt_bug, projection_bug]
    caplog.set_level(logging.WARNING, logger="activities")
    async with (
        engine_stack(settings, temporal_client, extra_types=types) as st,
        api_client(settings) as (_, c),
    ):
        expected = {
            prompt_bug.job_type: ("INTERNAL_ERROR", "RuntimeError: " + WITHHELD),
            projection_bug.job_type: (
                "INTERNAL_PROJECTION_FAILED",
                "projection failed: sqlalchemy.exc.DataError: SQLSTATE 22P02",
            ),
        }
        for jt in types:
            job_id = await st.create(job_type=jt.job_type, input={"echo": {"note": secret}})
            row = await st.wait_status(job_id, timeout=60)
            code, head = expected[jt.job_type]
            assert (row.lifecycle_status, row.error_code) == ("failed", code)

            r = await c.get(
                f"/admin-api/ai/jobs/{job_id}", headers=auth(settings, "root", admin=True)
            )
            assert r.status_code == 200, r.text
            message = r.json()["internalErrorMessage"]
            assert head in message, message
            frames = frames_of(message)
            assert 1 <= len(frames) <= STACK_MAX_FRAMES, message
            assert any(f.startswith("  activities/") for f in frames), message
            # Innermost last: where it broke (the test's own frame is not the engine's).
            # (A planned projection's statement fails where PROJECT's transaction sends it.)
            innermost = " in prompt" if jt is prompt_bug else "db/pipeline.py"
            assert innermost in frames[-1], message
            if jt is projection_bug:
                assert frames[-2].endswith(" in succeed_planned"), message
            assert len(message) <= INTERNAL_MESSAGE_MAX_CHARS
            assert secret not in message and secret not in r.text

            public = await c.get(f"/api/ai/jobs/{job_id}", headers=auth(settings, "u1"))
            assert "internalErrorMessage" not in public.json()
            assert "activities/" not in public.text

    formatter = logging.Formatter()
    tracebacks = [
        formatter.format(rec) for rec in caplog.records if rec.exc_info and rec.levelno >= 30
    ]
    assert any("Traceback" in t and "activities/execute.py" in t for t in tracebacks), tracebacks
    assert any("SQLSTATE 22P02" in t for t in tracebacks), tracebacks
    for t in tracebacks:
        assert secret not in t
