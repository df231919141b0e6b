"""A create's service options over HTTP: `serviceTier`, `reuse` and `offpeakDeadline` are stored
and shown on the job, and a tier or option the job type does not offer is a 422 naming it."""

from __future__ import annotations

from typing import Any

from tests.e2e.conftest import Api

CARDS = {"sourceText": "Ribosomes assemble proteins from amino acids.", "count": 2}
QUIZ = {"sourceText": "Ribosomes assemble proteins.", "count": 1}


def _locs(body: dict[str, Any]) -> list[list[str]]:
    return [e["loc"] for e in body.get("errors", [])]


async def test_the_job_shows_its_tier_and_no_reuse_source(api: Api) -> None:
    r = await api.create(jobType="flashcard_generation", input=CARDS, reuse="allow")
    body = r.json()
    assert body["serviceTier"] == "standard" and body["reusedFromJobId"] is None
    assert (await api.get(body["jobId"]))["serviceTier"] == "standard"


async def test_options_the_type_does_not_offer_are_refused_naming_the_field(api: Api) -> None:
    for extra, field in (
        ({"serviceTier": "batch"}, "serviceTier"),
        ({"serviceTier": "offpeak"}, "serviceTier"),
        ({"reuse": "allow"}, "reuse"),
    ):
        r = await api.create(jobType="quiz_generation", input=QUIZ, expect=422, **extra)
        assert r.json()["code"] == "VALIDATION_FAILED", r.text
        assert [field] in _locs(r.json()), r.text
    r = await api.create(
        jobType="flashcard_generation", input=CARDS, offpeakDeadline="standard", expect=422
    )
    assert ["offpeakDeadline"] in _locs(r.json()), r.text
    r = await api.create(jobType="flashcard_generation", input=CARDS, serviceTier="x", expect=422)
    assert any("serviceTier" in loc for loc in _locs(r.json())), r.text
