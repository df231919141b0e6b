"""A job type is one module plus one registration line (docs/adding-a-job-type.md).

The module below is written to a temporary directory, imported as a module of its own (not part
of `jobs/types/`) and registered beside the built-in types, exactly as `ALL_TYPES` would list it.
Nothing else is edited: the API validates and documents its input, the relay starts its
workflow, a worker runs it, and the artifacts API serves its output through the defaults.
"""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest
from temporalio.client import Client

from jobs.spec import Catalog
from jobs.types import ALL_TYPES
from runtime.wiring import api_app
from tests.integration.provider_helpers import auth
from tests.stack import JOB_QUEUES, engine_stack, make_settings

MODULE = '''
"""`tmp_summary`: the first words of a text (a throw-away job type of the test suite)."""

from __future__ import annotations

from pydantic import Field

from engine.definition import JobDefinition
from jobs.spec import JobInput, JobOutput, JobType, Prompt


class SummaryInput(JobInput):
    source_text: str = Field(min_length=1, max_length=2000)
    max_words: int = Field(default=20, ge=1, le=100)


class SummaryOutput(JobOutput):
    summary: str = Field(min_length=1, max_length=1000)


def build_prompt(inp: SummaryInput) -> Prompt:
    return Prompt(
        system="Summarise the text in at most the given number of words.",
        user=f"{inp.max_words} words:\\n<<<{inp.source_text}>>>",
    )


def synthetic_output(inp: SummaryInput) -> dict[str, object]:
    return {"summary": " ".join(inp.source_text.split()[: inp.max_words])}


JOB = JobType(
    definition=JobDefinition(job_type="tmp_summary", description="The first words of a text."),
    input_model=SummaryInput,
    output_model=SummaryOutput,
    build_prompt=build_prompt,
    synthetic_output=synthetic_output,
)
'''


@pytest.fixture
def new_type_module(tmp_path: Path) -> Iterator[ModuleType]:
    name = f"tmp_job_type_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


async def test_a_new_job_type_runs_end_to_end_from_its_module_alone(
    new_type_module: ModuleType,
    database_url: str,
    temporal_address: str,
    temporal_client: Client,
) -> None:
    catalog = Catalog([*ALL_TYPES, new_type_module.JOB])  # the one registration line
    settings = make_settings(database_url, temporal_address)
    app = api_app(settings, catalog=catalog)
    async with (
        engine_stack(settings, temporal_client, catalog=catalog, queues=JOB_QUEUES) as stack,
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c,
    ):
        headers = auth(settings, "u-new-type")

        # The API documents the new input and validates bodies against it.
        spec = (await c.get("/openapi.json")).json()
        assert "tmp_summary" in spec["x-job-types"]
        assert "SummaryInput" in spec["components"]["schemas"]
        bad = await c.post(
            "/api/ai/jobs",
            json={
                "jobType": "tmp_summary",
                "targetType": "doc",
                "targetId": "d1",
                "input": {"sourceText": "x", "surprise": 1},
            },
            headers=headers,
        )
        assert bad.status_code == 422, bad.text

        created = await c.post(
            "/api/ai/jobs",
            json={
                "jobType": "tmp_summary",
                "targetType": "doc",
                "targetId": "d1",
                "input": {"sourceText": "one two three four five", "maxWords": 3},
            },
            headers={**headers, "Idempotency-Key": "new-type-0001"},
        )
        assert created.status_code == 202, created.text
        job_id = uuid.UUID(created.json()["jobId"])

        row = await stack.wait_status(job_id, "succeeded", "failed", timeout=30)
        assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
        assert row.output == {"summary": "one two three"}
        # The definition's defaults, recorded on the job.
        assert (row.queue_name, row.priority, row.credential_mode) == (
            "ai-interactive",
            50,
            "platform_key",
        )
        assert (row.prompt_version, row.input_schema_version, row.output_schema_version) == (
            "tmp_summary.v1",
            "tmp_summary.input.v1",
            "tmp_summary.output.v1",
        )

        # Temporal ran a workflow of the new type, on the default queue (the suite gives each
        # test its own copy of the queue names).
        handle = temporal_client.get_workflow_handle(
            stack.workflow_id(job_id, job_type="tmp_summary")
        )
        described = await handle.describe()
        assert described.workflow_type == "tmp_summary"
        assert (described.task_queue or "").startswith("ai-interactive")

        # The default projector: the stored output is the job's one artifact.
        arts = await c.get(f"/api/ai/jobs/{job_id}/artifacts", headers=headers)
        assert arts.status_code == 200, arts.text
        items = arts.json()["items"]
        assert items == [
            {
                "artifactType": "job_output",
                "artifactId": str(job_id),
                "ordinal": 0,
                "content": {"summary": "one two three"},
                "final": True,  # projected: the job succeeded
                "chunk": None,  # a one-call job
            }
        ]
        # Another user sees none of it.
        other = await c.get(f"/api/ai/jobs/{job_id}/artifacts", headers=auth(settings, "u-other"))
        assert other.status_code == 404
