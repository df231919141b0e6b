"""A create's service options (jobs/tiers.py): the tier a job type accepts, reuse, an off-peak
deadline, and what they add to the request's fingerprint."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from engine.definition import JobDefinition, ServiceSpec, validate_definition
from engine.errors import InvalidJobDefinition, ValidationFailed
from jobs.policy import CreatePolicy, ProviderTraits
from jobs.requests import CreateJobRequest, RequestChecker
from jobs.types import default_catalog

CARDS = {"sourceText": "Ribosomes assemble proteins from amino acids.", "count": 2}
QUIZ = {"sourceText": "Ribosomes assemble proteins.", "count": 1}


def _check(job_type: str, input_: dict[str, Any], **kw: Any) -> Any:
    # A platform provider with a batch API and an off-peak window, so a batch or off-peak tier
    # is refused only by the job type.
    batch_api = {"platform_key": ProviderTraits("openai_compatible", batch_api=True)}
    window = {"openai_compatible": Decimal("0.5")}
    policy = CreatePolicy(
        model="deepseek-chat",
        platform_synthetic=False,
        providers=batch_api,
        offpeak_discounts=window,
    )
    checker = RequestChecker(default_catalog(), policy)
    req = CreateJobRequest(
        user_id="u1", job_type=job_type, target_type="t", target_id="1", input=input_, **kw
    )
    return checker.check(req)


def _refused_field(job_type: str, input_: dict[str, Any], **kw: Any) -> str:
    with pytest.raises(ValidationFailed) as info:
        _check(job_type, input_, **kw)
    loc = info.value.errors[0]["loc"]
    assert isinstance(loc, list)
    return str(loc[0])


def test_the_type_s_default_tier_when_the_create_names_none() -> None:
    assert _check("flashcard_generation", CARDS).service_tier == "standard"
    assert _check("flashcard_generation", CARDS, service_tier="batch").service_tier == "batch"


def test_a_tier_the_type_does_not_accept_is_refused_naming_the_field() -> None:
    assert _refused_field("quiz_generation", QUIZ, service_tier="batch") == "serviceTier"
    assert _refused_field("quiz_generation", QUIZ, service_tier="offpeak") == "serviceTier"
    assert _refused_field("quiz_generation", QUIZ, service_tier="express") == "serviceTier"


def test_reuse_only_where_the_type_permits_it() -> None:
    assert _refused_field("quiz_generation", QUIZ, reuse=True) == "reuse"
    assert _check("flashcard_generation", CARDS, reuse=True).service_tier == "standard"


def test_an_offpeak_deadline_only_with_the_offpeak_tier() -> None:
    at = datetime.now(UTC) + timedelta(hours=3)
    assert _refused_field("flashcard_generation", CARDS, offpeak_deadline_at=at) == (
        "offpeakDeadline"
    )
    assert (
        _refused_field(
            "flashcard_generation", CARDS, service_tier="offpeak", offpeak_on_deadline="later"
        )
        == "offpeakDeadline"
    )
    ok = _check("flashcard_generation", CARDS, service_tier="offpeak", offpeak_deadline_at=at)
    assert ok.service_tier == "offpeak"


def test_service_options_change_the_fingerprint_and_defaults_do_not() -> None:
    plain = _check("flashcard_generation", CARDS).fingerprint
    assert _check("flashcard_generation", CARDS, service_tier="standard").fingerprint == plain
    others = {
        _check("flashcard_generation", CARDS, service_tier="batch").fingerprint,
        _check("flashcard_generation", CARDS, reuse=True).fingerprint,
        _check("flashcard_generation", CARDS, service_tier="offpeak").fingerprint,
    }
    assert plain not in others and len(others) == 3


def test_a_default_tier_the_type_does_not_accept_is_an_invalid_definition() -> None:
    d = JobDefinition(job_type="cheap_thing", service=ServiceSpec(default_tier="batch"))
    with pytest.raises(InvalidJobDefinition):
        validate_definition(d)
    validate_definition(
        JobDefinition(job_type="cheap_thing", service=ServiceSpec(default_tier="batch", batch=True))
    )


def test_a_long_source_is_refused_on_the_batch_tier_and_taken_on_the_others() -> None:
    long = {"sourceText": "Ribosomes assemble proteins from amino acids. " * 6_000, "count": 5}
    assert _refused_field("flashcard_generation", long, service_tier="batch") == "serviceTier"
    assert _check("flashcard_generation", long).chunks  # standard: its chunks
    assert _check("flashcard_generation", CARDS, service_tier="batch").chunks is None
