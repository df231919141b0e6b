"""Every client mistake gets a clear answer over real HTTP (docs/api.md, "Errors"): unknown query
parameters, unknown or snake_case `input` members, non-JSON bodies, unknown job types, camelCase
path parameters in OpenAPI, `Allow` on a 405, and where to add a missing credential."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.e2e.conftest import Api, assert_problem

BODY = {"jobType": "synthetic", "targetType": "lesson", "targetId": "L1", "input": {}}


def locs(body: dict[str, Any]) -> list[list[str]]:
    return [e["loc"] for e in body.get("errors", [])]


@pytest.mark.parametrize(
    ("path", "admin"),
    [
        ("/api/ai/jobs", False),
        ("/admin-api/ai/jobs", True),
        ("/api/ai/usage", False),
        ("/api/ai/credentials", False),
        ("/api/ai/webhooks", False),
        ("/admin-api/ai/outbox", True),
        ("/healthz", False),
    ],
)
async def test_unknown_query_parameters_are_refused(api: Api, path: str, admin: bool) -> None:
    headers = api.as_admin() if admin else api.as_user()
    r = await api.http.get(path, params={"targetid": "L1", "errorCode": "X"}, headers=headers)
    body = assert_problem(r, 422, "VALIDATION_FAILED")
    assert ["query", "targetid"] in locs(body), body
    assert ["query", "errorCode"] in locs(body) or path == "/admin-api/ai/jobs", body


async def test_unknown_query_parameter_on_a_job_route(api: Api) -> None:
    job_id = await api.create_id()
    r = await api.http.get(f"/api/ai/jobs/{job_id}", params={"x": "1"}, headers=api.as_user())
    assert locs(assert_problem(r, 422, "VALIDATION_FAILED")) == [["query", "x"]]
    # Known parameters still work, and nothing about them changed.
    r = await api.http.get("/api/ai/jobs", params={"limit": 5}, headers=api.as_user())
    assert r.status_code == 200, r.text


async def test_unknown_and_snake_case_input_fields_are_located_in_the_body(api: Api) -> None:
    r = await api.create(input={"delayMs": 1, "bogus": 1}, expect=None)
    body = assert_problem(r, 422, "VALIDATION_FAILED")
    assert locs(body) == [["body", "input", "bogus"]], body
    r = await api.create(input={"delay_ms": 1}, expect=None)
    assert ["body", "input", "delay_ms"] in locs(assert_problem(r, 422, "VALIDATION_FAILED"))
    r = await api.create(input={"delayMs": -1}, expect=None)
    assert locs(assert_problem(r, 422, "VALIDATION_FAILED")) == [["body", "input", "delayMs"]]
    quiz = {"sourceText": "Photosynthesis turns light into sugar.", "count": 2}
    r = await api.create(jobType="quiz_generation", input=quiz, expect=None)
    assert r.status_code in (202, 422), r.text  # accepted as camelCase (422 only for a key)
    if r.status_code == 422:
        assert r.json()["code"] == "CREDENTIAL_MISSING", r.text
    snake = {"source_text": quiz["sourceText"], "count": 2}
    r = await api.create(jobType="quiz_generation", input=snake, expect=None)
    got = locs(assert_problem(r, 422, "VALIDATION_FAILED"))
    assert ["body", "input", "source_text"] in got and ["body", "input", "sourceText"] in got
    # Every error of the body is located from the root, top-level ones too.
    r = await api.create(expect=None, bogus=1)
    assert ["body", "bogus"] in locs(assert_problem(r, 422, "VALIDATION_FAILED"))


async def test_unknown_job_type_names_the_accepted_ones(api: Api) -> None:
    r = await api.create(jobType="no_such_type", expect=None)
    body = assert_problem(r, 422, "VALIDATION_FAILED")
    assert locs(body) == [["body", "jobType"]]
    msg = body["errors"][0]["msg"]
    for name in ("quiz_generation", "flashcard_generation", "synthetic"):
        assert name in msg and name in body["detail"], body
    q = await api.http.post(
        "/api/ai/jobs/quote", json={**BODY, "jobType": "nope"}, headers=api.as_user()
    )
    assert locs(assert_problem(q, 422, "VALIDATION_FAILED")) == [["body", "jobType"]]


@pytest.mark.parametrize(
    "headers",
    [{}, {"Content-Type": "text/plain"}, {"Content-Type": "application/x-www-form-urlencoded"}],
)
async def test_a_body_that_is_not_json_is_415(api: Api, headers: dict[str, str]) -> None:
    import json

    content = json.dumps(BODY).encode()
    for path in ("/api/ai/jobs", "/api/ai/jobs/quote", "/api/ai/credentials"):
        r = await api.http.post(path, content=content, headers={**api.as_user(), **headers})
        assert_problem(r, 415, "UNSUPPORTED_MEDIA_TYPE")
    ok = await api.http.post(
        "/api/ai/jobs",
        content=content,
        headers={**api.as_user(), "Content-Type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 202, ok.text


async def test_a_post_without_a_body_on_a_bodyless_route_is_fine(api: Api) -> None:
    job_id = await api.create_id()
    r = await api.http.post(f"/api/ai/jobs/{job_id}/cancel", headers=api.as_user())
    assert r.status_code == 200, r.text


async def test_path_parameters_are_camel_case_in_openapi(api: Api) -> None:
    spec = (await api.http.get("/openapi.json")).json()
    for path, item in spec["paths"].items():
        assert "_id}" not in path, path
        for op in item.values():
            for param in op.get("parameters", []):
                if param["in"] == "path":
                    assert "_" not in param["name"], (path, param)
    assert "/api/ai/jobs/{jobId}" in spec["paths"]
    for path, item in spec["paths"].items():
        for method, op in item.items():
            assert "422" in op["responses"], (method, path)
            if "requestBody" in op:
                assert "415" in op["responses"], (method, path)


async def test_every_405_carries_allow(api: Api) -> None:
    cases = {
        f"/api/ai/jobs/{uuid.uuid4()}": ("PUT", "DELETE, GET"),
        # A literal path is its own resource, not the /api/ai/jobs/{jobId} template's.
        "/api/ai/jobs/quote": ("GET", "POST"),
        "/admin-api/ai/bulk/cancel": ("GET", "POST"),
        "/api/ai/jobs": ("PUT", "GET, POST"),
        "/healthz": ("POST", "GET"),
        f"/api/ai/jobs/{uuid.uuid4()}/cancel": ("GET", "POST"),
    }
    for path, (method, allow) in cases.items():
        r = await api.http.request(method, path, headers=api.as_user())
        assert_problem(r, 405, "METHOD_NOT_ALLOWED")
        assert r.headers["allow"] == allow, (path, r.headers.get("allow"))


async def test_credential_missing_says_how_to_add_a_key(api: Api) -> None:
    r = await api.create(
        jobType="quiz_generation",
        input={"sourceText": "Some text to quiz on.", "count": 1},
        credentialMode="user_deepseek_key",
        expect=None,
    )
    body = assert_problem(r, 422, "CREDENTIAL_MISSING")
    assert "POST /api/ai/credentials" in body["detail"], body
