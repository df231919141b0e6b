"""The OpenAPI document, made to tell the truth about errors and formats.

FastAPI documents the success answer of a route and a generic 422. `document_errors` adds, to
every operation, each problem+json status it can answer (`Problem` schema):

- 401 on every route that needs a bearer token, 403 on the admin routes;
- 404 on routes with a path parameter (the resource, or someone else's, is not found);
- 422 on every route (an unknown query parameter), and the state-dependent refusals;
- 400, 413 and 415 on routes with a body (the body limit runs before authentication);
- 503 where the database (or the AI platform) may be unavailable;
- 409 and 429 where a route's state rules or quotas produce them.

Unauthenticated routes (`/healthz`, `/readyz`, `/metrics`) get `security: []`. Opaque cursors,
the Idempotency-Key header and provider keys get their format and length.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from api import openapi_docs, stream_schema
from api.cursors import CURSOR_PATTERN
from api.errors import PROBLEM
from jobs.spec import Catalog

UNAUTHENTICATED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,255}$"
API_KEY_PATTERN = r"^[\x21-\x7e]+$"
# Text PostgreSQL can store: no NUL (what the create body's strings are checked for).
STORABLE_TEXT_PATTERN = r"^[^\x00]*$"

DESCRIPTIONS: dict[int, str] = {
    400: "Malformed request (`BAD_REQUEST`), e.g. a body longer than its Content-Length",
    401: "Missing, invalid or expired bearer token (`UNAUTHENTICATED`)",
    403: "The route requires the SUPER_ADMIN role (`FORBIDDEN`)",
    404: "Not found, or not yours (`*_NOT_FOUND`, `NOT_FOUND`)",
    409: "The resource's state does not allow this (`JOB_NOT_CANCELLABLE`, ...)",
    413: "The body exceeds 3 MiB (`PAYLOAD_TOO_LARGE`); checked before authentication",
    415: "The body is not JSON (`UNSUPPORTED_MEDIA_TYPE`): send `Content-Type: application/json`",
    422: "Invalid or unknown parameters or body (`VALIDATION_FAILED`, with `errors` located "
    '`["query", name]`, `["body", field, ...]`), or a refusal that '
    "depends on stored state (`IDEMPOTENCY_KEY_REUSED`, `CREDENTIAL_MISSING`)",
    429: "Too many active jobs or quota used up (`TOO_MANY_JOBS`, `QUOTA_EXCEEDED`); see "
    "Retry-After",
    503: "A dependency is unavailable (`SERVICE_UNAVAILABLE`, `PLATFORM_UNAVAILABLE`); see "
    "Retry-After",
}
# Statuses only some routes produce, beyond what their shape implies.
EXTRA: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/api/ai/jobs"): (404, 429),  # 404 CREDENTIAL_NOT_FOUND: a `credentialId`
    ("post", "/api/ai/jobs/{jobId}/cancel"): (409,),
    ("post", "/admin-api/ai/jobs/{jobId}/retry"): (409,),
    ("post", "/admin-api/ai/outbox/{eventId}/requeue"): (409,),
    ("post", "/admin-api/ai/jobs/{jobId}/cancel"): (409,),
}


class ProblemError(BaseModel):
    loc: list[str] = Field(
        default_factory=list,
        description='Where: `["query", name]`, `["body", field, ...]` or `["body", "input", ...]`',
    )
    msg: str = Field(description="What is wrong, in words")
    type: str = Field(description="What kind of mistake (`missing`, `extra_forbidden`, ...)")


class Problem(BaseModel):
    """An RFC 9457 problem; `code` is the stable, machine-readable error code."""

    type: str = Field(description="Always `about:blank`")
    title: str = Field(description="A short summary of the problem")
    status: int = Field(ge=400, le=599, description="The HTTP status")
    detail: str = Field(description="What happened, for a person to read")
    code: str = Field(description="e.g. `JOB_NOT_FOUND`, `VALIDATION_FAILED`, `UNAUTHENTICATED`")
    errors: list[ProblemError] | None = Field(
        default=None, description="What was invalid (422 `VALIDATION_FAILED` only)"
    )


_READY = {
    "type": "object",
    "required": ["status", "checks"],
    "properties": {
        "status": {
            "type": "string",
            "enum": ["ready", "unavailable"],
            "title": "Status",
            "description": "`ready` when every check is `ok`",
        },
        "checks": {
            "type": "object",
            "title": "Checks",
            "description": "Each dependency (`database`, `temporal`) and its state",
            "additionalProperties": {"type": "string", "enum": ["ok", "unavailable"]},
        },
    },
}


def _statuses(method: str, path: str, op: dict[str, Any]) -> set[int]:
    out: set[int] = set()
    public = path in UNAUTHENTICATED_PATHS
    if not public:
        out |= {401, 503}
    if path.startswith("/admin-api/"):
        out.add(403)
    if "{" in path:
        out.add(404)
    # Every route refuses a query parameter it does not take (api/strict.py).
    out.add(422)
    if "requestBody" in op:
        out |= {400, 413, 415}
    out |= set(EXTRA.get((method, path), ()))
    return out


def _problem_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }


def _no_null_headers(op: dict[str, Any]) -> None:
    """A header is text or absent, never JSON null: an optional header's `anyOf [..., null]`
    (FastAPI's spelling of Optional) would have clients send the text `null`."""
    for param in op.get("parameters", []):
        schema = param.get("schema", {})
        if param.get("in") != "header" or "anyOf" not in schema:
            continue
        options = [o for o in schema["anyOf"] if o.get("type") != "null"]
        if len(options) == 1:
            rest = {k: v for k, v in schema.items() if k not in ("anyOf", "default")}
            param["schema"] = {**options[0], **rest}


def _formats(op: dict[str, Any]) -> None:
    for param in op.get("parameters", []):
        if param.get("name") == "cursor":
            param["description"] = "Opaque: the `nextCursor` of the previous page (empty: first)"
            param["schema"] = {
                "anyOf": [
                    {"type": "string", "pattern": CURSOR_PATTERN, "maxLength": 200},
                    {"type": "null"},
                ],
                "title": "Cursor",
            }
        elif param.get("name") == "Idempotency-Key":
            param["description"] = "1-255 visible ASCII characters"
            param["schema"] = {
                "anyOf": [
                    {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN, "maxLength": 255},
                    {"type": "null"},
                ],
                "title": "Idempotency-Key",
            }


def _component_formats(comps: dict[str, Any]) -> None:
    for name, comp in comps.items():
        props = comp.get("properties", {}) if isinstance(comp, dict) else {}
        nxt = props.get("nextCursor")
        if nxt is not None and name.endswith("Page"):
            nxt["description"] = "Opaque; pass it as `cursor` for the next page (null: last)"
            nxt["anyOf"] = [
                {"type": "string", "pattern": CURSOR_PATTERN, "minLength": 1, "maxLength": 200},
                {"type": "null"},
            ]
        key = props.get("apiKey")
        if key is not None:
            key.update(
                {"type": "string", "pattern": API_KEY_PATTERN, "minLength": 8, "maxLength": 512}
            )
            key["description"] = "8-512 visible ASCII characters, no spaces; never returned"


# A webhook receiver's URL is http(s) with a host (jobs/webhooks.py `check_url`); what the
# schema cannot say (credentials in it, a private address in production, a port out of range)
# is refused with 422 by the route.
WEBHOOK_URL_PATTERN = r"^[Hh][Tt][Tt][Pp][Ss]?://[^\s/?#]+([/?#]\S*)?$"


def body_rules(comps: dict[str, Any]) -> None:
    """What a body's validation checks across its fields, in the schema: a schedule has
    exactly one of `intervalSeconds` and `cron` (`oneOf`: a body with both, or neither, is
    schema-invalid), a webhook's URL is http(s)."""
    schedule = comps.get("CreateScheduleBody")
    if isinstance(schedule, dict):
        given = "Given (not null): exactly one of intervalSeconds and cron is"
        schedule["oneOf"] = [
            {
                "title": "Every intervalSeconds",
                "required": ["intervalSeconds"],
                "properties": {
                    "intervalSeconds": {
                        "type": "integer",
                        "title": "Interval seconds",
                        "description": given,
                    }
                },
            },
            {
                "title": "On a cron expression",
                "required": ["cron"],
                "properties": {"cron": {"type": "string", "title": "Cron", "description": given}},
            },
        ]
    for name in ("CreateWebhookBody", "CreateAdminWebhookBody"):
        webhook = comps.get(name)
        url = webhook.get("properties", {}).get("url") if isinstance(webhook, dict) else None
        if isinstance(url, dict):
            url["pattern"] = WEBHOOK_URL_PATTERN


def document_errors(schema: dict[str, Any]) -> None:
    comps = schema.setdefault("components", {}).setdefault("schemas", {})
    problem = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    for k, v in problem.pop("$defs", {}).items():
        comps[k] = v
    comps["Problem"] = problem
    for name in ("HTTPValidationError", "ValidationError"):
        comps.pop(name, None)
    _component_formats(comps)
    body_rules(comps)
    for path, item in schema.get("paths", {}).items():
        for method, op in item.items():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            responses: dict[str, Any] = op["responses"]
            responses.pop("422", None)  # FastAPI's, with a body we never send
            if path in UNAUTHENTICATED_PATHS:
                op["security"] = []
            if path == "/readyz":
                ready = {"application/json": {"schema": _READY}}
                responses["200"] = {"description": "Ready", "content": ready}
                responses["503"] = {"description": "Not ready", "content": ready}
            for status in sorted(_statuses(method, path, op)):
                given = responses.get(str(status), {})
                if PROBLEM in given.get("content", {}):
                    continue  # documented by the route itself
                responses[str(status)] = _problem_response(
                    given.get("description") or DESCRIPTIONS[status]
                )
            _formats(op)
            _no_null_headers(op)


def job_type_bodies(
    schema: dict[str, Any],
    types: Sequence[tuple[str, str, Sequence[str]]],
    pins: dict[str, tuple[str, str]] | None = None,
) -> None:
    """`jobType` is an enum of the public job types, and the create body is one variant per
    type (`jobType` names it, `input` is that type's input, `credentialMode` one it allows,
    `promptVersion` and `outputSchemaVersion` exemplified by the versions it has now).
    `types`: (jobType, input schema name, allowed credential modes); `pins`: per jobType, its
    (prompt version, output schema version)."""
    comps = schema["components"]["schemas"]
    create = schema["paths"]["/api/ai/jobs"]["post"]
    media = create["requestBody"]["content"]["application/json"]
    ref = media["schema"].get("$ref", "").split("/")[-1]
    if ref not in comps or not types:
        return
    base = comps[ref]
    props = base["properties"]
    props["jobType"] = {
        "type": "string",
        "enum": [t for t, _, _ in types],
        "title": "Jobtype",
        "description": "One of the public job types",
    }
    for key in ("targetType", "targetId"):
        if key in props:
            props[key]["pattern"] = STORABLE_TEXT_PATTERN
    variants = []
    for job_type, input_name, modes in types:
        variant = copy.deepcopy(base)
        variant["title"] = f"Create {job_type}"
        variant["properties"]["jobType"] = {"type": "string", "enum": [job_type]}
        variant["properties"]["input"] = {"$ref": f"#/components/schemas/{input_name}"}
        if comps.get(input_name, {}).get("required"):
            variant["required"] = [*variant.get("required", []), "input"]
        variant["properties"]["credentialMode"] = {
            "anyOf": [{"type": "string", "enum": list(modes)}, {"type": "null"}]
        }
        versions = (pins or {}).get(job_type)
        for key, version in zip(
            ("promptVersion", "outputSchemaVersion"), versions or (), strict=False
        ):
            if key in variant["properties"] and version:
                variant["properties"][key]["examples"] = [version]  # a pin this type accepts
        name = f"{ref}_{job_type}"
        comps[name] = variant
        variants.append({"$ref": f"#/components/schemas/{name}"})
    media["schema"] = {
        "oneOf": variants,
        "discriminator": {
            "propertyName": "jobType",
            "mapping": {t: v["$ref"] for (t, _, _), v in zip(types, variants, strict=True)},
        },
    }


def install(app: FastAPI, catalog: Catalog, *, synthetic_public: bool) -> None:
    """`app.openapi` builds the document once: FastAPI's, plus each public job type's input
    schema (so clients see what `input` takes), the bearer scheme and every problem answer."""

    def build() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        schema["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
        }
        schema["security"] = [{"bearer": []}]
        variants = []
        public: list[tuple[str, str, Sequence[str]]] = []
        pins: dict[str, tuple[str, str]] = {}
        for jt in catalog:
            if not jt.definition.creatable(development=synthetic_public):
                continue
            name = jt.input_model.__name__
            sub = jt.input_model.model_json_schema(
                by_alias=True, ref_template="#/components/schemas/{model}"
            )
            for k, v in sub.pop("$defs", {}).items():
                comps[k] = v
            sub["description"] = f"`input` of jobType `{jt.job_type}`: {jt.definition.description}"
            comps[name] = sub
            variants.append({"$ref": f"#/components/schemas/{name}"})
            public.append((jt.job_type, name, jt.definition.credential.allowed_modes))
            d = jt.definition
            pins[jt.job_type] = (d.prompt_version, d.output.schema_version)
        # Only the types a client may create: `synthetic` must not show up in production.
        schema.setdefault("x-job-types", [t for t, _, _ in public])
        create = schema["paths"]["/api/ai/jobs"]["post"]
        body = create["requestBody"]["content"]["application/json"]["schema"]
        ref = body.get("$ref", "").split("/")[-1]
        if ref in comps and variants:
            comps[ref]["properties"]["input"] = {"oneOf": variants, "title": "Input"}
        job_type_bodies(schema, public, pins)
        comps.update(stream_schema.components())  # the item events' `data`
        document_errors(schema)
        openapi_docs.describe(schema, [t for t, _, _ in public])
        app.openapi_schema = schema
        return schema

    app.openapi = build  # type: ignore[method-assign]
