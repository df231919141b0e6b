"""A job type keeps every published prompt and output schema version (jobs/spec.py,
jobs/versions.py): the listing, the one lookup (`JobType.version`), the type as a job recorded
with a version runs it (`JobType.at`, `Catalog.for_job`), registration's checks, and the
built-in `.v1` prompts exactly as they were published."""

from __future__ import annotations

import dataclasses
import hashlib
from types import SimpleNamespace

import pytest

from engine.errors import (
    ExecutionFailure,
    InvalidJobDefinition,
    VersionUnavailable,
    is_retryable,
)
from jobs.reuse import reuse_key
from jobs.spec import Catalog, OutputVersion, PromptVersion
from jobs.types import default_catalog
from jobs.types import flashcard_generation as cards
from jobs.types import quiz_generation as quiz
from jobs.types import weak_point_analysis as weak

BUILT_IN = ("flashcard_generation", "quiz_generation", "weak_point_analysis")


@pytest.mark.parametrize("job_type", BUILT_IN)
def test_each_built_in_type_publishes_v1_and_v2_oldest_first(job_type: str) -> None:
    jt = default_catalog().get(job_type)
    assert jt.prompt_versions == (f"{job_type}.v1", f"{job_type}.v2")
    assert jt.prompt_versions[-1] == jt.definition.prompt_version  # the default is last
    assert jt.output_schema_versions == (f"{job_type}.output.v1",)


def test_the_lookup_gives_each_versions_builder_and_model() -> None:
    jt = cards.JOB
    old = jt.version("flashcard_generation.v1")
    assert old.build_prompt is cards.build_prompt_v1
    assert old.output_model is cards.FlashcardGenerationOutput
    default = jt.version()
    assert (default.prompt_version, default.build_prompt) == (cards.PROMPT_VERSION, jt.build_prompt)


def test_an_unpublished_version_is_refused_naming_the_field() -> None:
    with pytest.raises(VersionUnavailable) as caught:
        cards.JOB.version("flashcard_generation.v9", "flashcard_generation.output.v9")
    assert [e["loc"] for e in caught.value.errors] == [
        ["body", "promptVersion"],
        ["body", "outputSchemaVersion"],
    ]
    assert "flashcard_generation.v1" in caught.value.public_message


def test_the_type_at_a_version_builds_and_records_that_version() -> None:
    assert cards.JOB.at(None, None) is cards.JOB
    assert cards.JOB.at(cards.PROMPT_VERSION, "flashcard_generation.output.v1") is cards.JOB
    v1 = cards.JOB.at("flashcard_generation.v1", None)
    inp = cards.FlashcardGenerationInput(source_text="Cells divide.", count=2)
    assert v1.prompt(inp) == cards.build_prompt_v1(inp) != cards.build_prompt(inp)
    assert v1.definition.prompt_version == "flashcard_generation.v1"
    assert v1.definition.job_type == cards.JOB.job_type  # the rest of its policy unchanged
    # A reuse key hashes the version: a .v1 job never reuses a .v2 answer.
    keys = {
        reuse_key("flashcard_generation", {}, jt.definition.prompt_version, "m", "o")
        for jt in (v1, cards.JOB)
    }
    assert len(keys) == 2


def test_a_job_recorded_with_an_unpublished_version_fails_for_good() -> None:
    row = SimpleNamespace(
        job_type="flashcard_generation",
        prompt_version="flashcard_generation.v0",
        output_schema_version="flashcard_generation.output.v1",
    )
    with pytest.raises(ExecutionFailure) as caught:
        default_catalog().for_job(row)
    assert caught.value.code == "PROMPT_VERSION_UNAVAILABLE"
    assert not is_retryable(caught.value.code, attempt=1)
    row.prompt_version = "flashcard_generation.v1"
    assert default_catalog().for_job(row).build_prompt is cards.build_prompt_v1


def test_registration_refuses_a_version_published_twice() -> None:
    twice = dataclasses.replace(
        cards.JOB, earlier_prompts=(PromptVersion(cards.PROMPT_VERSION, cards.build_prompt_v1),)
    )
    with pytest.raises(InvalidJobDefinition, match="twice"):
        Catalog([twice])
    output_twice = dataclasses.replace(
        cards.JOB,
        earlier_outputs=(
            OutputVersion("flashcard_generation.output.v1", cards.FlashcardGenerationOutput),
        ),
    )
    with pytest.raises(InvalidJobDefinition, match="twice"):
        Catalog([output_twice])


# The `.v1` prompts as published before `.v2` moved the stable text first: sha256 of system +
# NUL + user for these inputs, taken from the texts in the git history. They must never change:
# a job pinned to `.v1` builds exactly them.
V1_DIGESTS = {
    "flashcard_generation": "67290482476a43a291d519ba5f1f19059a0ada75efcc5d7b4484bf4591cd5af6",
    "quiz_generation": "af9c6c2b2df29b9929ea73d786a3e6f73ea33fd83db6c428bd8b540c219d42d9",
    "weak_point_analysis": "92268b73d5e30d25ff6d10dd0a14ae608385d60d0b1dcf2b7ebe488296c25e07",
}
TEXT = "Enzymes speed reactions. They are proteins."


@pytest.mark.parametrize("job_type", BUILT_IN)
def test_the_v1_prompts_are_the_published_texts(job_type: str) -> None:
    inp = {
        "flashcard_generation": cards.FlashcardGenerationInput(source_text=TEXT, count=3),
        "quiz_generation": quiz.QuizGenerationInput(source_text=TEXT, count=1, difficulty="hard"),
        "weak_point_analysis": weak.WeakPointAnalysisInput(
            answers=[
                weak.AnswerRecord(
                    question="2+2?",
                    given_answer="5",
                    correct_answer="4",
                    is_correct=False,
                    topic="arith",
                )
            ]
        ),
    }[job_type]
    p = default_catalog().get(job_type).version(f"{job_type}.v1").build_prompt(inp)
    digest = hashlib.sha256(f"{p.system}\x00{p.user}".encode()).hexdigest()
    assert digest == V1_DIGESTS[job_type]
