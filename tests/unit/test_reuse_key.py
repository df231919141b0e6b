"""The result-reuse key (jobs/reuse.py `reuse_key`): the same request on the same model, prompt
and schema gives the same key; any one of them changed gives another, so a job never reuses an
answer to a different question."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.reuse import reuse_key

BASE: dict[str, Any] = {
    "job_type": "flashcard_generation",
    "normalized_input": {"sourceText": "Photosynthesis makes sugar.", "count": 5},
    "prompt_version": "flashcard_generation.prompt.v1",
    "model": "deepseek-chat",
    "output_schema_version": "flashcard_generation.output.v1",
}


def test_the_same_request_gives_the_same_key() -> None:
    same = dict(BASE, normalized_input={"count": 5, "sourceText": "Photosynthesis makes sugar."})
    assert reuse_key(**BASE) == reuse_key(**same)  # key order in the input does not matter
    assert len(reuse_key(**BASE)) == 64


@pytest.mark.parametrize(
    ("field", "other"),
    [
        ("normalized_input", {"sourceText": "Photosynthesis makes sugar.", "count": 6}),
        ("normalized_input", {"sourceText": "Photosynthesis makes sugar!", "count": 5}),
        ("prompt_version", "flashcard_generation.prompt.v2"),
        ("model", "gpt-4o-mini"),
        ("output_schema_version", "flashcard_generation.output.v2"),
        ("job_type", "quiz_generation"),
    ],
)
def test_any_part_changed_gives_another_key(field: str, other: Any) -> None:
    assert reuse_key(**dict(BASE, **{field: other})) != reuse_key(**BASE)


def test_parts_cannot_run_into_each_other() -> None:
    # The parts are hashed as a list, not concatenated: moving text between two of them is
    # another key.
    a = dict(BASE, prompt_version="v1", model="m")
    b = dict(BASE, prompt_version="v1m", model="")
    assert reuse_key(**a) != reuse_key(**b)
