"""The API describes itself, offline: `/docs` and `/redoc` and every asset they load come from
the API's own process (no other host named), and `/openapi.json` has a summary, a description
and examples for every operation, and a description and a human title for every property."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from tests.e2e.conftest import Api

ASSET = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")
ANY_HOST = re.compile(r"\b(?:https?:)?//[A-Za-z0-9.-]+")


def properties(schema: Any, where: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Every (where, name, property) of a schema, nested inline objects included."""
    if isinstance(schema, dict):
        for name, prop in schema.get("properties", {}).items():
            yield where, name, prop
            yield from properties(prop, f"{where}.{name}")
        for key in ("items", "additionalProperties"):
            yield from properties(schema.get(key), f"{where}[{key}]")
        for key in ("anyOf", "oneOf", "allOf"):
            for i, sub in enumerate(schema.get(key, [])):
                yield from properties(sub, f"{where}/{key}{i}")


async def test_docs_and_redoc_load_only_from_the_api(api: Api) -> None:
    for page in ("/docs", "/redoc"):
        r = await api.http.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert not ANY_HOST.search(r.text), (page, ANY_HOST.findall(r.text))
        assets = ASSET.findall(r.text)
        assert any(a.endswith(".js") for a in assets), (page, assets)
        for asset in assets:
            parts = urlsplit(asset)
            assert not parts.scheme and not parts.netloc, asset
            got = await api.http.get(asset)
            assert got.status_code == 200 and got.content, (asset, got.status_code)
        assert "/openapi.json" in r.text


async def test_openapi_describes_every_operation_with_examples(api: Api) -> None:
    spec = (await api.http.get("/openapi.json")).json()
    for path, item in spec["paths"].items():
        for method, op in item.items():
            where = f"{method.upper()} {path}"
            assert op.get("summary"), where
            assert op.get("description"), where
            for media in op.get("requestBody", {}).get("content", {}).values():
                assert media.get("example") is not None or media.get("examples"), where
            for status, response in op["responses"].items():
                if not status.startswith("2"):
                    continue
                for media in response.get("content", {}).values():
                    assert media.get("example") is not None or media.get("examples"), (
                        where,
                        status,
                    )
    create = spec["paths"]["/api/ai/jobs"]["post"]["requestBody"]["content"]["application/json"]
    bodies = {e["value"]["jobType"]: e["value"] for e in create["examples"].values()}
    assert bodies["synthetic"]["input"] == {"echo": {"hello": "world"}}  # the README's quickstart
    assert bodies["quiz_generation"]["input"]["sourceText"].startswith("Photosynthesis")


async def test_every_property_has_a_description_and_a_human_title(api: Api) -> None:
    spec = (await api.http.get("/openapi.json")).json()
    schemas = dict(spec["components"]["schemas"])
    for path, item in spec["paths"].items():
        for method, op in item.items():
            for status, response in op["responses"].items():
                for media in response.get("content", {}).values():
                    schemas[f"{method} {path} {status}"] = media.get("schema", {})
    seen = 0
    for name, schema in schemas.items():
        for where, prop_name, prop in properties(schema, name):
            seen += 1
            assert prop.get("description"), (where, prop_name)
            title = prop.get("title", "")
            assert title, (where, prop_name)
            if re.search(r"[a-z][A-Z]", prop_name):  # camelCase: words apart in the title
                assert " " in title, (where, prop_name, title)
    assert seen > 100
    source = spec["components"]["schemas"]["QuizGenerationInput"]["properties"]["sourceText"]
    assert source["title"] == "Source text"
