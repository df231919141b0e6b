"""PII masking of a job's input and its restoring in the output (engine/pii.py,
jobs/guardrails.py): placeholders before any prompt, the originals back as written."""

from __future__ import annotations

from engine.pii import mask, valid_region
from jobs.guardrails import masked_input
from jobs.spec import AnyJobType
from jobs.types import flashcard_generation, weak_point_analysis

EMAIL, PHONE = "alice.smith@example.com", "+44 20 7946 0958"


def test_emails_and_phones_become_placeholders_the_same_value_the_same_one() -> None:
    text = f"Mail {EMAIL}, call {PHONE} or (212) 555-0123; again {EMAIL}."
    masked, m = mask({"a": text, "b": [EMAIL], "n": 3}, "US")
    assert EMAIL not in str(masked) and PHONE not in str(masked)
    assert masked["a"] == "Mail <EMAIL_1>, call <PHONE_1> or <PHONE_2>; again <EMAIL_1>."
    assert masked["b"] == ["<EMAIL_1>"] and masked["n"] == 3
    assert dict(m.originals) == {
        "<EMAIL_1>": EMAIL,
        "<PHONE_1>": PHONE,
        "<PHONE_2>": "(212) 555-0123",
    }


def test_the_output_gets_the_originals_exactly_as_written_and_nothing_else_changes() -> None:
    _, m = mask(f"{EMAIL} {PHONE}", "US")
    answer = {"cards": [{"back": "Reach <EMAIL_1> or <PHONE_1>; not <PHONE_9>."}], "n": 1}
    assert m.restore(answer) == {
        "cards": [{"back": f"Reach {EMAIL} or {PHONE}; not <PHONE_9>."}],
        "n": 1,
    }


def test_plain_numbers_years_and_prices_are_not_phones() -> None:
    text = "In 1998, 42 cells cost $3.50; see page 1234 and ISBN 978-3-16-148410-0."
    masked, m = mask(text, "US")
    assert masked == text and not m


def test_the_same_input_always_masks_the_same_way() -> None:
    inp = {"sourceText": f"{PHONE} then {EMAIL} then 020 7946 0958", "count": 2}
    assert mask(inp, "GB") == mask(inp, "GB")


def test_a_type_that_masks_builds_its_prompt_from_the_masked_input() -> None:
    jt: AnyJobType = flashcard_generation.JOB
    model = jt.input_model.model_validate({"sourceText": f"Contact {EMAIL}.", "count": 1})
    masked, m = masked_input(jt, model, "US")
    prompt = jt.prompt(masked)
    assert EMAIL not in prompt.user and "<EMAIL_1>" in prompt.user
    assert m.originals == {"<EMAIL_1>": EMAIL}
    assert model.source_text == f"Contact {EMAIL}."  # the input itself is unchanged


def test_a_type_that_does_not_mask_sends_its_input_as_written() -> None:
    jt = weak_point_analysis.JOB
    answer = {"question": "q", "givenAnswer": PHONE, "correctAnswer": "a", "isCorrect": False}
    model = jt.input_model.model_validate({"answers": [answer]})
    same, m = masked_input(jt, model, "US")
    assert same is model and not m


def test_regions() -> None:
    assert valid_region("US") and valid_region("GB") and not valid_region("XX")


def test_the_built_in_types_guardrails_and_a_new_type_s_defaults() -> None:
    import pytest

    from engine.definition import Guardrails, JobDefinition, SecuritySpec, validate_definition
    from engine.errors import InvalidJobDefinition
    from jobs.types import default_catalog

    got = {jt.job_type: jt.definition.guardrails for jt in default_catalog()}
    assert got["flashcard_generation"] == Guardrails(pii="mask", moderation="drop_item")
    assert got["quiz_generation"] == Guardrails(pii="mask", moderation="drop_item")
    assert got["weak_point_analysis"] == Guardrails(pii="off", moderation="fail")
    assert got["synthetic"].pii == "off"
    new = JobDefinition(job_type="brand_new")
    assert new.guardrails == Guardrails(pii="off", moderation="off")
    both = new.model_copy(
        update={
            "guardrails": Guardrails(pii="mask"),
            "security": SecuritySpec(output_redaction=True),
        }
    )
    with pytest.raises(InvalidJobDefinition):
        validate_definition(both)
