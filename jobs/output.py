"""A job type's output rule: what an answer must be to become a job's output. The one rule for a
provider's answer (EXECUTE) and for a long source's merged chunks (MERGE) alike, and the JSON
schema the provider is asked to answer in."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from pydantic import BaseModel, ValidationError

from engine.errors import ExecutionFailure
from engine.redaction import redact
from jobs.spec import AnyJobType
from providers.structured import strict_schema

Validated = tuple[dict[str, Any] | None, BaseModel | None, ExecutionFailure | None]

_NOT_JSON = object()  # an answer that did not parse: reported as such, never validated
# What PostgreSQL cannot store in a text or jsonb value: NUL, and a UTF-16 surrogate code point
# (JSON's `\u0000`, and a lone `\ud800`-`\udfff` escape, parse into such Python strings; a
# pair of escapes parses into one character and is fine).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
UNSTORABLE_HINT = (
    "a string holds a NUL character (\\u0000) or an unpaired UTF-16 surrogate "
    "(\\ud800-\\udfff), which cannot be stored; leave such characters out"
)


def validated_answer(jt: AnyJobType, content: str) -> Validated:
    """A provider's answer (its text) as the job's output: `validated_output` of its JSON."""
    try:
        data = json.loads(content)
    except ValueError:
        data = _NOT_JSON
    return validated_output(jt, data)


def validated_output(jt: AnyJobType, data: Any) -> Validated:
    """`data` as the job's output: validated by the type's output model, redacted when the type
    asks (as stored, and as the model the projector takes), or why it is not valid."""
    try:
        if data is _NOT_JSON:
            raise ValueError("not JSON")
        validated = jt.output_model.model_validate(data)
    except (ValueError, ValidationError) as exc:
        detail = (
            summarise_validation(exc)
            if isinstance(exc, ValidationError)
            else "output is not valid JSON"
        )
        return (
            None,
            None,
            ExecutionFailure(
                "VALIDATION_OUTPUT_INVALID",
                internal_message=f"VALIDATION_OUTPUT_INVALID: {detail}",
                correction_hint=detail,
                answered=True,  # a 200: the provider is reachable, the answer was not usable
            ),
        )
    if jt.definition.security.output_redaction:
        # Redacted before it is stored: the stored output, the projected rows and the hash all
        # see the masked text, still in the output model's shape.
        validated = jt.output_model.model_validate(redact(validated.model_dump(mode="json")))
    out = validated.model_dump(mode="json")
    if unstorable(out):
        # Checked here, before any write: the write would fail and take the call's usage row
        # with it (the row and the output share EXECUTE's last transaction).
        return None, None, unstorable_failure()
    return out, validated, None


def unstorable(value: Any, depth: int = 0) -> bool:
    """Whether `value` (JSON: dicts, lists, strings, numbers) holds a string, or a key, that
    PostgreSQL cannot store (`_UNSTORABLE`). A structure nested past any output model counts as
    unstorable rather than being walked without end."""
    if isinstance(value, str):
        return _UNSTORABLE.search(value) is not None
    if depth > 200:
        return True
    if isinstance(value, dict):
        return any(unstorable(k, depth + 1) or unstorable(v, depth + 1) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(unstorable(v, depth + 1) for v in value)
    return False


def unstorable_failure() -> ExecutionFailure:
    """An answer that validated but holds what cannot be stored: an invalid output like any
    other (a correction hint for the next attempt), never an internal error."""
    return ExecutionFailure(
        "VALIDATION_OUTPUT_INVALID",
        internal_message=f"VALIDATION_OUTPUT_INVALID: {UNSTORABLE_HINT}",
        correction_hint=UNSTORABLE_HINT,
        answered=True,
    )


@functools.cache
def output_schema(model: type[BaseModel]) -> dict[str, Any]:
    """JSON schema of an output model; built once per job type, not per call."""
    return model.model_json_schema()


@functools.cache
def strict_output_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The output model's schema in OpenAI's strict subset (providers/structured.py), what a
    `json_schema` call sends; once per model."""
    return strict_schema(output_schema(model))


def summarise_validation(exc: ValidationError) -> str:
    """What was wrong with an output, without the output itself (pydantic's messages)."""
    parts = []
    for e in exc.errors(include_url=False, include_input=False)[:10]:
        loc = ".".join(str(p) for p in e.get("loc", ())) or "(root)"
        parts.append(f"{loc}: {e.get('msg', '')}")
    # A location may name a key of the answer: what cannot be stored is dropped from it, so
    # the hint (stored with the attempt, sent back in the next prompt) can be.
    return _UNSTORABLE.sub("", "; ".join(parts))
