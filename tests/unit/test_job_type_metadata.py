"""A job type's metadata (label, domain, version) is set on every built-in type and checked at
registration: a definition without a usable label, domain or version is refused."""

from __future__ import annotations

import pytest

from engine.definition import DOMAINS, JobDefinition, validate_definition
from engine.errors import InvalidJobDefinition
from jobs.types import default_catalog


def test_every_built_in_type_names_its_label_domain_and_version() -> None:
    for jt in default_catalog():
        d = jt.definition
        assert {"label", "domain", "version"} <= d.model_fields_set, jt.job_type
        assert d.label.strip() and d.version and d.domain in DOMAINS
        validate_definition(d)


def test_left_out_metadata_has_usable_defaults() -> None:
    d = JobDefinition(job_type="essay_feedback")
    assert (d.label, d.domain, d.version) == ("Essay feedback", "generation", "1")
    validate_definition(d)


@pytest.mark.parametrize(
    "bad",
    [{"label": "   "}, {"label": "x" * 101}, {"version": ""}, {"version": "v" * 129}],
)
def test_registration_refuses_unusable_metadata(bad: dict[str, str]) -> None:
    d = JobDefinition(job_type="essay_feedback").model_copy(update=bad)
    with pytest.raises(InvalidJobDefinition):
        validate_definition(d)


def test_an_unknown_domain_is_refused() -> None:
    with pytest.raises(ValueError):
        JobDefinition(job_type="essay_feedback", domain="translation")
    d = JobDefinition(job_type="essay_feedback").model_copy(update={"domain": "translation"})
    with pytest.raises(InvalidJobDefinition):
        validate_definition(d)
