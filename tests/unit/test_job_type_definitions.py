"""The built-in job types without a server: their definitions, bounded inputs, strictly validated
outputs, deterministic synthetic outputs and prompts. Running them through the engine is
tests/integration/test_job_types.py."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from engine.definition import JOB_TYPE_PATTERN, JobDefinition, validate_definition
from engine.errors import InvalidJobDefinition
from engine.queues import resolve_execution
from jobs.spec import AnyJobType
from jobs.types import default_catalog
from jobs.types import flashcard_generation as flashcards
from jobs.types import quiz_generation as quiz
from jobs.types import weak_point_analysis as weak
from tests.job_data import ANSWERS, INPUTS, LONGEST, SOURCE


def test_definitions_follow_design_section_7() -> None:
    catalog = default_catalog()
    for job_type, queue, retries, backoff in (
        ("quiz_generation", "ai-interactive", 1, 2000),
        ("flashcard_generation", "ai-interactive", 1, 2000),
        ("weak_point_analysis", "ai-background", 2, 5000),
    ):
        d = catalog.get(job_type).definition
        assert d.visibility == "public"
        assert d.queue.queue_name == queue
        policy = resolve_execution(d)  # the definition's own values, else its queue's
        assert (policy.max_retries, policy.backoff_ms) == (retries, backoff)
        assert d.credential.allowed_modes == ("platform_key", "user_deepseek_key")
        assert d.credential.default_mode == "platform_key"
        assert d.security.content_safety_check is True
        # v2: the prompts moved the job's own text after the stable part (prefix caching).
        assert d.prompt_version == f"{job_type}.v2"


@pytest.mark.parametrize(
    ("module", "bad"),
    [
        (quiz, {"sourceText": ""}),
        (quiz, {"sourceText": "   \n "}),
        (quiz, {"sourceText": "x" * (quiz.MAX_SOURCE_CHARS + 1)}),
        (quiz, {"sourceText": "text", "count": 0}),
        (quiz, {"sourceText": "text", "count": 21}),
        (quiz, {"sourceText": "text", "difficulty": "impossible"}),
        (quiz, {"sourceText": "text", "extra": 1}),
        (flashcards, {"sourceText": "text", "count": 31}),
        (flashcards, {}),
        (weak, {"answers": []}),
        (weak, {"answers": [{"question": "q", "correctAnswer": "a", "isCorrect": True}]}),
        (weak, {"answers": [ANSWERS[0]] * 101}),
    ],
)
def test_inputs_are_bounded(module: Any, bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        module.JOB.input_model.model_validate(bad)


def _question(**over: Any) -> dict[str, Any]:
    q = {"question": "Q?", "choices": ["a", "b", "c", "d"], "answer_index": 0, "explanation": "E"}
    q.update(over)
    return q


@pytest.mark.parametrize(
    ("module", "bad"),
    [
        (quiz, {"questions": []}),
        (quiz, {"questions": [_question(choices=["a", "b", "c"])]}),
        (quiz, {"questions": [_question(choices=["a", "b", "c", "d", "e"])]}),
        (quiz, {"questions": [_question(choices=["a", "b", "A", "d"])]}),
        (quiz, {"questions": [_question(answer_index=4)]}),
        (quiz, {"questions": [_question(answer_index=-1)]}),
        (quiz, {"questions": [_question(explanation="")]}),
        (quiz, {"questions": [_question()] * 21}),
        (quiz, {"questions": [_question(hint="x")]}),
        (flashcards, {"flashcards": [{"front": " ", "back": "b"}]}),
        (flashcards, {"flashcards": []}),
        (weak, {"weak_points": [{"topic": "t", "evidence": [], "recommended_action": "a"}]}),
        (weak, {}),
        (weak, {"unexpected": True}),
    ],
)
def test_outputs_are_validated_strictly(module: Any, bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        module.JOB.output_model.model_validate(bad)


@pytest.mark.parametrize(
    ("module", "inp"),
    [
        (quiz, {"sourceText": "!!!", "count": 20}),
        (quiz, {"sourceText": "concept process structure principle example evidence"}),
        (quiz, {"sourceText": "y" * 20_000, "count": 7, "difficulty": "easy"}),
        (quiz, {"sourceText": "光合作用把光能转化为化学能。它发生在叶绿体中\uff01", "count": 4}),
        (quiz, {"sourceText": SOURCE, "count": 20}),
        (flashcards, {"sourceText": "?"}),
        (flashcards, {"sourceText": SOURCE + " " + "z" * 19_000, "count": 30}),
        (weak, {"answers": [{**ANSWERS[1]}]}),  # all correct: no weak point
        (weak, {"answers": [{**ANSWERS[0], "topic": None}] * 100}),
    ],
)
def test_synthetic_outputs_are_valid_and_deterministic(module: Any, inp: dict[str, Any]) -> None:
    jt: AnyJobType = module.JOB
    model = jt.input_model.model_validate(inp)
    first = jt.synthetic_output(model)
    out = jt.output_model.model_validate(first)
    assert isinstance(out, BaseModel)
    assert jt.synthetic_output(jt.input_model.model_validate(inp)) == first
    if module is quiz:
        assert len(first["questions"]) == model.count


def test_quiz_synthetic_questions_answer_from_the_text() -> None:
    out = quiz.synthetic_output(quiz.QuizGenerationInput(source_text=SOURCE, count=4))
    q = out["questions"][0]
    answer = q["choices"][q["answer_index"]]
    assert (
        q["question"]
        .replace("_____", answer)
        .endswith('"Photosynthesis converts light energy into chemical energy."')
    )
    assert [q["answer_index"] for q in out["questions"]] == [0, 1, 2, 3]


@pytest.mark.parametrize("module", [quiz, flashcards, weak])
def test_prompts_state_the_json_shape_and_carry_the_correction(module: Any) -> None:
    jt: AnyJobType = module.JOB
    inp = jt.input_model.model_validate(INPUTS[jt.job_type])
    plain = jt.prompt(inp)
    fixed = jt.prompt(inp, "questions.0.choices: List should have at least 4 items")
    key = {"quiz_generation": "questions", "flashcard_generation": "flashcards"}.get(
        jt.job_type, "weak_points"
    )
    assert f'{{"{key}": [' in plain.system and "JSON" in plain.system
    assert "Correction" not in plain.user
    assert fixed.system == plain.system
    assert fixed.user.startswith(plain.user)
    assert fixed.user.endswith("Correction: questions.0.choices: List should have at least 4 items")


def test_the_name_is_the_longest_the_registry_accepts() -> None:
    assert len(LONGEST) == 64 and JOB_TYPE_PATTERN.fullmatch(LONGEST)
    assert not JOB_TYPE_PATTERN.fullmatch(LONGEST + "x")


def test_registration_refuses_a_version_no_job_could_store() -> None:
    too_long = JobDefinition(job_type="fine_name", prompt_version="v" * 129)
    with pytest.raises(InvalidJobDefinition, match="prompt_version"):
        validate_definition(too_long)
