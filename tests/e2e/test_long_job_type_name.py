"""Every name the registry accepts works: a job type with the longest accepted name (64
characters) is created over HTTP and runs to `succeeded`, its default versions recorded whole.
Before the version columns were widened this create was a 500 (`<jobType>.output.v1` did not
fit 32 characters)."""

from __future__ import annotations

import dataclasses
import uuid

from sqlalchemy import text
from temporalio.client import Client

from db.session import SessionMaker
from engine.definition import JobDefinition
from jobs.spec import Catalog
from jobs.types import synthetic
from tests.e2e.conftest import start_api
from tests.job_data import LONGEST
from tests.stack import catalog_with, engine_stack, make_settings


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
