"""Every name the registry accepts works: a job type with the longest accepted name (64
characters) is created over HTTP and runs to `succeeded`, its default versions recorded whole.
Before the version columns were widened this create was a 500 (`<jobType>.output.v1` did not
fit 32 characters)."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from sqlalchemy import text
from temporalio.client import Client

from db.session import SessionMaker
from engine.definition import JOB_TYPE_PATTERN, JobDefinition, validate_definition
from engine.errors import InvalidJobDefinition
from jobs.spec import Catalog
from jobs.types import synthetic
from tests.e2e.conftest import start_api
from tests.stack import catalog_with, engine_stack, make_settings

LONGEST = "t" + "_long_name" * 6 + "_ab"  # 64 characters


def test_the_name_is_the_longest_the_registry_accepts() -> None:
    assert len(LONGEST) == 64 and JOB_TYPE_PATTERN.fullmatch(LONGEST)
    assert not JOB_TYPE_PATTERN.fullmatch(LONGEST + "x")


def test_registration_refuses_a_version_no_job_could_store() -> None:
    too_long = JobDefinition(job_type="fine_name", prompt_version="v" * 129)
    with pytest.raises(InvalidJobDefinition, match="prompt_version"):
        validate_definition(too_long)


async def test_a_job_type_with_the_longest_name_is_created_and_runs(
    db: SessionMaker, database_url: str, temporal_address: str, temporal_client: Client
) -> None:
    # Built from its name alone, so the versions take their defaults from it.
    definition = JobDefinition.model_validate(
        {
            **synthetic.DEFINITION.model_dump(exclude={"input", "output", "prompt_version"}),
            "job_type": LONGEST,
        }
    )
    assert definition.output.schema_version == f"{LONGEST}.output.v1"  # 74 characters
    longest = dataclasses.replace(synthetic.JOB, definition=definition)
    catalog: Catalog = catalog_with(longest)
    settings = make_settings(database_url, temporal_address)
    async with (
        engine_stack(settings, temporal_client, catalog=catalog) as st,
        start_api(settings, catalog=catalog) as api,
    ):
        r = await api.create(jobType=LONGEST, input={"echo": {"n": 1}})
        assert r.status_code == 202, r.text
        job_id = r.json()["jobId"]
        assert r.json()["jobType"] == LONGEST
        done = await api.wait_status(job_id, timeout=30)
        assert done["lifecycleStatus"] == "succeeded", done
        row = await st.job(uuid.UUID(job_id))
        assert (row.prompt_version, row.input_schema_version, row.output_schema_version) == (
            f"{LONGEST}.v1",
            f"{LONGEST}.input.v1",
            f"{LONGEST}.output.v1",
        )
    async with db() as s:
        wid = await s.scalar(text("SELECT workflow_id FROM ai_job WHERE id = :id"), {"id": job_id})
    assert wid == f"ai-interactive:{LONGEST}:{job_id}"
