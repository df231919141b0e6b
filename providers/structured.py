"""Structured output: the form a call asks its model to answer in, and OpenAI's strict schema.

Three forms, highest first: `json_schema` (the output model's schema, enforced by the provider:
`response_format: {"type": "json_schema", "json_schema": {"name", "schema", "strict": true}}`),
`json_object` (any JSON object) and `none` (no `response_format` at all). Which form a model is
asked in (`FormPolicy`): an AI_FALLBACKS entry's own `structuredOutput`, else AI_STRUCTURED_OUTPUT
(model name -> form, `"*"` for any other model), else a model whose name starts with `deepseek`
takes `json_object` (DeepSeek offers only that) and any other `json_schema`. A (base URL, model)
that refused a form is asked in the next one down (`lower`, `next_form`) for a while
(jobs/structured_output.py keeps that in PostgreSQL); nothing here probes a server.

`strict_schema` derives what the provider is sent from the job's output model's JSON schema, in
OpenAI's strict subset: at every object (nested, in `$defs`) `additionalProperties: false` and
every property `required`; the keywords outside the subset (`minLength`, `maxLength`,
`default`) are left out. The engine's own validation (jobs/output.py) still enforces all of
them. `refuses_form` tells a 400 that names `response_format` (OpenAI's `param`, or a message
like DeepSeek's "This response_format type is unavailable now") from any other.

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from engine.errors import ExecutionFailure

Form = Literal["json_schema", "json_object", "none"]
FORMS: tuple[Form, ...] = ("json_schema", "json_object", "none")  # highest first
DEFAULT_FOR_ANY = "*"
# Keywords outside OpenAI's strict subset: left out of the sent schema (validation keeps them).
_UNSUPPORTED = frozenset({"minLength", "maxLength", "default"})
_NAME_BAD = re.compile(r"[^A-Za-z0-9_-]+")
_MENTIONS = re.compile(r"response_format|json_schema", re.IGNORECASE)


class FormRefused(ExecutionFailure):
    """A 400 refusing the request's structured-output form (`refuses_form`): REQUEST_REJECTED
    to anyone who does not know better; EXECUTE asks again at once in the next form."""

    def __init__(self, form: str, internal_message: str) -> None:
        super().__init__("REQUEST_REJECTED", internal_message=internal_message, answered=True)
        self.form = form


def is_form(value: object) -> bool:
    return isinstance(value, str) and value in FORMS


def next_form(form: str) -> Form | None:
    """The form below `form` (None below `none`)."""
    if form not in FORMS:
        return None
    i = FORMS.index(form)
    return FORMS[i + 1] if i + 1 < len(FORMS) else None


def lower(a: str, b: str | None) -> Form:
    """The lower of two forms (`b` None: `a`)."""
    if a not in FORMS:
        a = "json_object"
    if b is None or b not in FORMS:
        return FORMS[FORMS.index(a)]
    return FORMS[max(FORMS.index(a), FORMS.index(b))]


def default_form(model: str) -> Form:
    """A model nobody configured: DeepSeek's models take json_object, any other json_schema."""
    return "json_object" if model.strip().lower().startswith("deepseek") else "json_schema"


def parse_forms(text: str) -> dict[str, Form]:
    """AI_STRUCTURED_OUTPUT: a JSON object of model name (lower-cased; `*` any other) -> form.
    Empty: `{}`. Raises ValueError naming the setting."""
    if not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError("AI_STRUCTURED_OUTPUT: not valid JSON") from None
    if not isinstance(raw, dict):
        raise ValueError("AI_STRUCTURED_OUTPUT: want a JSON object of model name -> form")
    out: dict[str, Form] = {}
    for model, form in raw.items():
        if not isinstance(model, str) or not model.strip() or len(model) > 128:
            raise ValueError("AI_STRUCTURED_OUTPUT: a model name must have 1-128 characters")
        if not is_form(form):
            raise ValueError(
                f"AI_STRUCTURED_OUTPUT: the form of {model.strip()[:40]!r} must be one of "
                + ", ".join(FORMS)
            )
        out[model.strip().lower()] = cast(Form, form)
    return out


@dataclass(frozen=True)
class FormPolicy:
    """The configured form of each model: `forms` (AI_STRUCTURED_OUTPUT) and the forms the
    AI_FALLBACKS entries name for themselves (`entries`, by model, lower-cased)."""

    forms: Mapping[str, Form] = field(default_factory=dict)
    entries: Mapping[str, Form] = field(default_factory=dict)

    def configured(self, model: str, *, entry: bool = False) -> Form:
        """The form `model` is asked in before any refusal; `entry`: the call goes to an
        AI_FALLBACKS entry of that model (whose own `structuredOutput` wins)."""
        key = model.strip().lower()
        if entry and key in self.entries:
            return self.entries[key]
        if key in self.forms:
            return self.forms[key]
        if DEFAULT_FOR_ANY in self.forms:
            return self.forms[DEFAULT_FOR_ANY]
        return default_form(model)


def schema_name(version: str) -> str:
    """The `json_schema.name` of an output schema version: 1-64 of [A-Za-z0-9_-]."""
    name = _NAME_BAD.sub("_", version).strip("_")[:64]
    return name or "output"


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` (a pydantic model's JSON schema) in OpenAI's strict subset (module docstring)."""
    return cast(dict[str, Any], _strict(schema))


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _UNSUPPORTED:
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, Mapping):
            out[key] = {name: _strict(sub) for name, sub in value.items()}
        else:
            out[key] = _strict(value)
    if out.get("type") == "object" or "properties" in out:
        props = out.get("properties")
        out["properties"] = dict(props) if isinstance(props, Mapping) else {}
        out["required"] = list(out["properties"])
        out["additionalProperties"] = False
    return out


def response_format(
    form: str, name: str, schema: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The request's `response_format` for `form` (None: leave it out). `schema` is the strict
    schema (`strict_schema`); json_schema without one asks for json_object."""
    if form == "none":
        return None
    if form == "json_schema" and schema is not None:
        return {
            "type": "json_schema",
            "json_schema": {"name": schema_name(name), "schema": dict(schema), "strict": True},
        }
    return {"type": "json_object"}


def form_of_body(body: Mapping[str, Any]) -> Form:
    """The form a chat request body asks for (a batch line's)."""
    fmt = body.get("response_format")
    if not isinstance(fmt, Mapping):
        return "none"
    kind = fmt.get("type")
    return "json_schema" if kind == "json_schema" else "json_object"


def refuses_form(status: int, body: str) -> bool:
    """Whether an error answer refuses the request's `response_format`: a 400 whose error
    names it (`param`), or whose message mentions `response_format` or `json_schema`."""
    if status != 400:
        return False
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        param = error.get("param")
        if isinstance(param, str) and param.startswith("response_format"):
            return True
        message = error.get("message")
        return isinstance(message, str) and bool(_MENTIONS.search(message))
    return bool(_MENTIONS.search(body[:2000]))
