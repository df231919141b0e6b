"""A job runs the versions it was created with (jobs/spec.py `Catalog.for_job`), on the engine
against the fake OpenAI-compatible server: the catalog the jobs are created with is today's, the
workers run a later deploy whose flashcard type defaults to a `.v3` prompt and keeps `.v1` and
`.v2`. A job created with the default of its day (`.v2`) sends `.v2`'s prompt; one pinned to
`.v1` sends `.v1`'s on every attempt (a retry after an invalid answer included); one recorded
with a version the deploy no longer publishes fails at RESOLVE with PROMPT_VERSION_UNAVAILABLE,
with no call."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from pydantic import BaseModel
from temporalio.client import Client

from jobs.service import CreateJobRequest, JobService
from jobs.spec import Catalog, Prompt, PromptVersion
from jobs.types import ALL_TYPES
from jobs.types import flashcard_generation as cards
from runtime.wiring import create_policy
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import fake_env, user_prompts
from tests.job_data import INPUTS, SCRIPTED
from tests.stack import Stack, engine_stack, make_settings

CARDS = "flashcard_generation"
V0, V1, V2, V3 = (f"{CARDS}.v{n}" for n in range(4))


def build_v3(inp: Any) -> Prompt:
    return Prompt(system="v3 system", user=f"v3 of a text of {len(inp.source_text)} characters")


def build_v0(inp: BaseModel) -> Prompt:
    return Prompt(system="v0 system", user="v0")


def catalog_of(jt: Any) -> Catalog:
    return Catalog([jt if t.job_type == CARDS else t for t in ALL_TYPES])


# Today's catalog plus a `.v0` that the later deploy unpublished.
TODAY = catalog_of(
    dataclasses.replace(
        cards.JOB, earlier_prompts=(PromptVersion(V0, build_v0), *cards.JOB.earlier_prompts)
    )
)
# The later deploy: `.v3` is the default, `.v1` and `.v2` stay published, `.v0` is gone.
LATER = catalog_of(
    dataclasses.replace(
        cards.JOB,
        definition=cards.DEFINITION.model_copy(update={"prompt_version": V3}),
        build_prompt=build_v3,
        earlier_prompts=(*cards.JOB.earlier_prompts, PromptVersion(V2, cards.build_prompt)),
    )
)


async def create(st: Stack, **kw: Any) -> uuid.UUID:
    """A flashcard job created by today's API (today's catalog), run by the later workers."""
    svc = JobService(st.parts.sessionmaker, TODAY, create_policy(st.settings))
    req = CreateJobRequest(
        user_id="u1", job_type=CARDS, target_type="t", target_id="1", input=INPUTS[CARDS], **kw
    )
    return (await svc.create(req)).job.id


def model_input() -> cards.FlashcardGenerationInput:
    return cards.FlashcardGenerationInput.model_validate(INPUTS[CARDS])


async def test_jobs_run_the_versions_they_were_created_with(
    database_url: str, temporal_address: str, temporal_client: Client, fake: FakeOpenAIServer
) -> None:
    answer = {"kind": "valid", "content": SCRIPTED[CARDS], "tokens_in": 50, "tokens_out": 40}
    settings = make_settings(database_url, temporal_address, **fake_env(fake))
    async with engine_stack(settings, temporal_client, catalog=LATER) as st:
        await fake.ascript([], default=answer)
        plain = await create(st)
        done = await st.wait_status(plain, timeout=60)
        assert done.lifecycle_status == "succeeded", done.error_code
        assert done.prompt_version == V2
        assert await user_prompts(fake) == [cards.build_prompt(model_input()).user]

        await fake.areset()
        await fake.ascript([{"kind": "schema_invalid"}], default=answer)
        pinned = await create(st, prompt_version=V1)
        done = await st.wait_status(pinned, timeout=60)
        assert done.lifecycle_status == "succeeded", done.error_code
        assert done.prompt_version == V1
        sent = await user_prompts(fake)
        v1 = cards.build_prompt_v1(model_input()).user
        assert len(sent) == 2 and sent[0] == v1, sent
        assert sent[1].startswith(v1 + "\n\nCorrection: ")  # the retry: v1 and its correction

        await fake.areset()
        gone = await create(st, prompt_version=V0)
        done = await st.wait_status(gone, timeout=60)
        assert (done.lifecycle_status, done.error_code) == ("failed", "PROMPT_VERSION_UNAVAILABLE")
        assert done.attempt_count == 0
        assert (await fake.acalls())["count"] == 0
