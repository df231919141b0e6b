"""Every built-in prompt puts its stable part first: the system message and the user message up
to the source are the same for every input, so DeepSeek's and OpenAI's automatic prefix caches
serve them to the next job of the type at the cache-hit price. Whatever varies per job (the
source, counts, difficulty) comes after; a change that moves any of it forward fails here."""

from __future__ import annotations

from typing import Any

import pytest

from engine.tokens import count_tokens
from jobs.chunked import ChunkPolicy, chunk_prompt, plan
from jobs.spec import AnyJobType, Prompt
from jobs.types import ALL_TYPES
from jobs.types import quiz_generation as quiz

CACHE_UNIT = 64  # DeepSeek caches prompts in units of 64 tokens

_SOURCE_A = "Photosynthesis converts light energy into chemical energy in the chloroplasts."
_SOURCE_B = "光合作用把光能转化为化学能。Le Calvin cycle fixe le dioxyde de carbone."


def _answers(tag: str, correct: bool) -> list[dict[str, Any]]:
    return [
        {
            "question": f"{tag}: where does photosynthesis happen?",
            "givenAnswer": f"{tag} mitochondria",
            "correctAnswer": f"{tag} chloroplasts",
            "isCorrect": correct,
            "topic": f"{tag} biology",
        }
    ]


# Per type: two inputs that differ in every field, and two that differ only in what is not the
# source (the "knobs": counts, difficulty). `None`: the type has no source (its prompt is fixed).
_DIFFERENT: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "quiz_generation": (
        {"sourceText": _SOURCE_A, "count": 3, "difficulty": "hard"},
        {"sourceText": _SOURCE_B, "count": 17, "difficulty": "easy"},
    ),
    "flashcard_generation": (
        {"sourceText": _SOURCE_A, "count": 2},
        {"sourceText": _SOURCE_B, "count": 29},
    ),
    "weak_point_analysis": (
        {"answers": _answers("alpha", False)},
        {"answers": _answers("omega", True) * 7},
    ),
    "synthetic": ({}, {"delayMs": 5, "failTimes": 2, "echo": {"x": "y"}}),
}
_KNOBS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "quiz_generation": (
        {"sourceText": _SOURCE_A, "count": 3, "difficulty": "hard"},
        {"sourceText": _SOURCE_A, "count": 17, "difficulty": "easy"},
    ),
    "flashcard_generation": (
        {"sourceText": _SOURCE_A, "count": 2},
        {"sourceText": _SOURCE_A, "count": 29},
    ),
}
_SOURCE_OF = {
    "quiz_generation": lambda raw: raw["sourceText"],
    "flashcard_generation": lambda raw: raw["sourceText"],
    # The answers as the prompt lists them: from the first answer's topic on.
    "weak_point_analysis": lambda raw: raw["answers"][0]["topic"],
}


def commonprefix(texts: list[str]) -> str:
    """The longest text every one of `texts` starts with."""
    first, last = min(texts), max(texts)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n]


def _prompt(jt: AnyJobType, raw: dict[str, Any]) -> Prompt:
    return jt.prompt(jt.input_model.model_validate(raw))


def test_every_built_in_type_is_covered() -> None:
    assert {jt.job_type for jt in ALL_TYPES} == set(_DIFFERENT)


@pytest.mark.parametrize("jt", ALL_TYPES, ids=lambda jt: jt.job_type)
def test_the_part_before_the_source_does_not_depend_on_the_input(jt: AnyJobType) -> None:
    raw_a, raw_b = _DIFFERENT[jt.job_type]
    a, b = _prompt(jt, raw_a), _prompt(jt, raw_b)
    assert a.system == b.system  # the system message never carries the input
    shared = len(commonprefix([a.user, b.user]))
    source_of = _SOURCE_OF.get(jt.job_type)
    if source_of is None:
        assert a == b
        return
    for raw, p in ((raw_a, a), (raw_b, b)):
        start = p.user.index(source_of(raw))
        assert shared >= start, (jt.job_type, p.user[shared:start])
    # The shared prefix is worth caching: at least one whole 64-token unit.
    assert count_tokens(a.system + a.user[:shared]) >= CACHE_UNIT


@pytest.mark.parametrize("job_type", sorted(_KNOBS))
def test_counts_and_difficulty_come_after_the_source(job_type: str) -> None:
    """Two jobs of one source that differ in their counts share everything up to the source's
    end: nothing that varies stands before it."""
    jt = next(t for t in ALL_TYPES if t.job_type == job_type)
    raw_a, raw_b = _KNOBS[job_type]
    a, b = _prompt(jt, raw_a), _prompt(jt, raw_b)
    assert a.system == b.system
    end = a.user.index(raw_a["sourceText"]) + len(raw_a["sourceText"])
    assert len(commonprefix([a.user, b.user])) >= end


def test_every_difficulty_is_described_in_the_stable_part() -> None:
    for level in ("easy", "medium", "hard"):
        assert f"- {level}: " in quiz.SYSTEM_PROMPT


def test_chunks_of_one_job_share_the_prefix_and_the_correction_comes_last() -> None:
    jt = quiz.JOB
    source = " ".join(f"Sentence number {n} states a fact about topic {n % 7}." for n in range(400))
    inp = jt.input_model.model_validate({"sourceText": source, "count": 6})
    chunks = plan(jt, inp, ChunkPolicy(max_input_tokens=1000))
    assert chunks is not None and len(chunks) >= 2
    prompts = [chunk_prompt(jt, inp, c) for c in chunks]
    assert len({p.system for p in prompts}) == 1
    shared = len(commonprefix([p.user for p in prompts]))
    assert all(shared >= p.user.index("Sentence number") for p in prompts)
    # A retry's correction is appended: the whole first prompt stays its prefix.
    plain = jt.prompt(inp)
    fixed = jt.prompt(inp, "questions.0.choices: List should have at least 4 items")
    assert fixed.system == plain.system and fixed.user.startswith(plain.user)
