"""`GET /api/ai/job-types` over real HTTP: every registered job type describes itself (label,
domain, versions, queue policy, the JSON Schema of its input) to any authenticated user; no
token is 401. The built-in types all carry their metadata."""

from __future__ import annotations

from typing import Any

from api.routes.job_types import EXAMPLE
from engine.definition import DOMAINS
from jobs.types import default_catalog
from tests.e2e.conftest import Api, assert_problem

KEYS = {
    "name",
    "label",
    "domain",
    "version",
    "description",
    "queue",
    "priority",
    "timeoutSeconds",
    "maxAttempts",
    "promptVersion",
    "promptVersions",
    "inputSchemaVersion",
    "outputSchemaVersion",
    "outputSchemaVersions",
    "inputSchema",
    "defaultServiceTier",
    "serviceTiers",
    "reuse",
    "ttlSeconds",
}


async def test_any_user_lists_every_registered_job_type_with_its_metadata(api: Api) -> None:
    r = await api.http.get("/api/ai/job-types", headers=api.as_user("alice"))
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    catalog = api.app.state.aijobs.catalog
    assert [t["name"] for t in items] == [jt.job_type for jt in catalog]
    for item in items:
        assert set(item) == KEYS, item
        d = catalog.get(item["name"]).definition
        assert item["domain"] in DOMAINS
        assert item["defaultServiceTier"] in item["serviceTiers"]
        assert ("batch" in item["serviceTiers"]) == d.service.batch
        assert item["reuse"] == d.service.reuse
        assert item["ttlSeconds"] == d.ttl_seconds
        assert item["label"] == d.label and item["label"].strip()
        for key in ("version", "promptVersion", "outputSchemaVersion", "inputSchemaVersion"):
            assert isinstance(item[key], str) and item[key], (key, item)
        assert item["promptVersion"] == d.prompt_version
        assert item["outputSchemaVersion"] == d.output.schema_version
        # Every published version, oldest first; the default is the newest.
        jt = catalog.get(item["name"])
        assert item["promptVersions"] == list(jt.prompt_versions)
        assert item["promptVersions"][-1] == item["promptVersion"]
        assert item["outputSchemaVersions"][-1] == item["outputSchemaVersion"]
        assert (item["queue"], item["priority"]) == (d.queue.queue_name, d.queue.default_priority)
        assert item["timeoutSeconds"] * 1000 == d.execution.timeout_ms
        assert item["maxAttempts"] == d.max_attempts >= 1
        schema = item["inputSchema"]
        assert schema["type"] == "object" and "properties" in schema, schema
    by_name = {t["name"]: t for t in items}
    assert {"quiz_generation", "flashcard_generation", "weak_point_analysis"} <= set(by_name)
    assert by_name["weak_point_analysis"]["domain"] == "analysis"
    assert by_name["quiz_generation"]["domain"] == "generation"
    assert by_name["quiz_generation"]["promptVersions"] == [
        "quiz_generation.v1",
        "quiz_generation.v2",
    ]
    # The input schema is the one a create validates against (camelCase names).
    assert "delayMs" in by_name["synthetic"]["inputSchema"]["properties"]


async def test_an_admin_sees_the_same_listing(api: Api) -> None:
    user = await api.http.get("/api/ai/job-types", headers=api.as_user("bob"))
    admin = await api.http.get("/api/ai/job-types", headers=api.as_admin())
    assert admin.status_code == 200
    assert admin.json() == user.json()


async def test_the_listing_needs_a_token(api: Api) -> None:
    r = await api.http.get("/api/ai/job-types")
    assert_problem(r, 401, "UNAUTHENTICATED")
    assert "Bearer" in r.headers.get("www-authenticate", "")
    assert_problem(
        await api.http.get("/api/ai/job-types", headers=api.expired()), 401, "UNAUTHENTICATED"
    )


async def test_the_route_is_documented_with_an_example(api: Api) -> None:
    spec = (await api.http.get("/openapi.json")).json()
    op = spec["paths"]["/api/ai/job-types"]["get"]
    assert op["summary"] and op["description"]
    example = op["responses"]["200"]["content"]["application/json"]["example"]
    assert example == EXAMPLE
    assert set(example["items"][0]) == KEYS
    assert "401" in op["responses"]


def test_every_built_in_type_sets_its_metadata() -> None:
    for jt in default_catalog():
        d = jt.definition
        # Set in the type's own definition, not left to the defaults.
        assert {"label", "domain", "version"} <= d.model_fields_set, jt.job_type
