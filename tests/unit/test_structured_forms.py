"""The structured-output form each model is asked in, the strict schema a json_schema call
sends, and which 400s refuse a form (providers/structured.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobs.output import output_schema, strict_output_schema
from jobs.types import flashcard_generation, quiz_generation, weak_point_analysis
from providers.base import ProviderRequest
from providers.fallback import parse_fallbacks
from providers.openai_compat import chat_body
from providers.structured import (
    FormPolicy,
    lower,
    next_form,
    parse_forms,
    refuses_form,
    response_format,
    schema_name,
)


def _walk(node: Any) -> list[dict[str, Any]]:
    out = []
    if isinstance(node, dict):
        out.append(node)
        for v in node.values():
            out.extend(_walk(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(_walk(v))
    return out


@pytest.mark.parametrize("module", [flashcard_generation, quiz_generation, weak_point_analysis])
def test_the_strict_schema_closes_every_object_and_drops_what_strict_mode_refuses(
    module: Any,
) -> None:
    full = output_schema(module.JOB.output_model)
    strict = strict_output_schema(module.JOB.output_model)
    assert "$defs" in strict and strict["$defs"].keys() == full["$defs"].keys()
    objects = [n for n in _walk(strict) if n.get("type") == "object"]
    assert len(objects) >= 2
    for obj in objects:
        assert obj["additionalProperties"] is False
        assert obj["required"] == list(obj["properties"])
    keys = {k for n in _walk(strict) for k in n if k not in ("properties", "$defs")}
    assert not keys & {"minLength", "maxLength", "default"}
    assert "title" in keys  # fine in the strict subset
    # The model's own schema keeps every rule (validation enforces them).
    assert "minLength" in json.dumps(full) and "maxLength" in json.dumps(full)


def test_a_property_named_like_a_keyword_is_kept() -> None:
    from providers.structured import strict_schema

    got = strict_schema({"type": "object", "properties": {"default": {"type": "string"}}})
    assert got["properties"] == {"default": {"type": "string"}} and got["required"] == ["default"]


def test_the_configured_form_entry_first_then_the_setting_then_the_name() -> None:
    policy = FormPolicy(
        parse_forms('{"gpt-4o-mini": "json_object", "*": "none"}'), {"gpt-4o": "json_schema"}
    )
    assert policy.configured("gpt-4o-mini") == "json_object"
    assert policy.configured("anything") == "none"
    assert policy.configured("gpt-4o", entry=True) == "json_schema"
    assert policy.configured("gpt-4o") == "none"  # not as an entry: the setting's
    bare = FormPolicy()
    assert bare.configured("deepseek-chat") == "json_object"
    assert bare.configured("DeepSeek-Reasoner") == "json_object"
    assert bare.configured("gpt-4o-mini") == "json_schema"


@pytest.mark.parametrize("text", ["[1]", "not json", '{"m": "xml"}', '{"": "none"}', '{"m": 1}'])
def test_a_malformed_setting_names_itself(text: str) -> None:
    with pytest.raises(ValueError, match="AI_STRUCTURED_OUTPUT"):
        parse_forms(text)


def test_an_entry_may_name_its_form_and_only_a_form() -> None:
    entry = {"model": "gpt-4o-mini", "baseUrl": "https://x.test/v1", "apiKey": "sk-1"}
    [e] = parse_fallbacks(json.dumps([{**entry, "structuredOutput": "json_schema"}]))
    assert e.structured_output == "json_schema"
    with pytest.raises(ValueError, match="structuredOutput"):
        parse_fallbacks(json.dumps([{**entry, "structuredOutput": "yaml"}]))


def test_forms_go_down_one_at_a_time() -> None:
    assert next_form("json_schema") == "json_object"
    assert next_form("json_object") == "none"
    assert next_form("none") is None
    assert lower("json_schema", "json_object") == "json_object"
    assert lower("json_object", "json_schema") == "json_object"  # a downgrade never raises
    assert lower("json_schema", None) == "json_schema"


@pytest.mark.parametrize(
    ("status", "body", "refused"),
    [
        (400, {"error": {"message": "This response_format type is unavailable now"}}, True),
        (400, {"error": {"message": "bad", "param": "response_format"}}, True),
        (400, {"error": {"message": "Invalid schema for json_schema 'x'"}}, True),
        (400, {"error": {"message": "max_tokens too large", "param": "max_tokens"}}, False),
        (422, {"error": {"message": "response_format"}}, False),
        (500, {"error": {"message": "response_format"}}, False),
    ],
)
def test_which_400s_refuse_the_form(status: int, body: dict[str, Any], refused: bool) -> None:
    assert refuses_form(status, json.dumps(body)) is refused


def _request(form: str) -> ProviderRequest:
    model = flashcard_generation.JOB.output_model
    return ProviderRequest(
        job_id="j",
        job_type="flashcard_generation",
        attempt=1,
        model="m",
        system_prompt="s",
        user_prompt="u",
        output_schema=output_schema(model),
        timeout_s=1,
        structured_output=form,
        schema_name="flashcard_generation.output.v1",
        strict_schema=strict_output_schema(model) if form == "json_schema" else None,
    )


def test_the_body_asks_in_the_request_s_form() -> None:
    schema = chat_body(_request("json_schema"), stream=None)["response_format"]
    assert schema["type"] == "json_schema" and schema["json_schema"]["strict"] is True
    assert schema["json_schema"]["name"] == "flashcard_generation_output_v1"
    assert chat_body(_request("json_object"), stream=None)["response_format"] == {
        "type": "json_object"
    }
    assert "response_format" not in chat_body(_request("none"), stream=None)
    assert response_format("json_schema", "x", None) == {"type": "json_object"}


def test_the_schema_name_is_1_to_64_of_the_allowed_characters() -> None:
    assert schema_name("a.b c/d") == "a_b_c_d"
    assert schema_name("...") == "output"
    assert len(schema_name("x" * 100)) == 64
