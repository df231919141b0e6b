"""Requests are refused rather than half-understood: a query parameter the route does not take
(422 `VALIDATION_FAILED`, located `["query", name]`) and a body that is not JSON (415
`UNSUPPORTED_MEDIA_TYPE`) are answered, never ignored. A client's typo (`?targetid=`) would
otherwise return every row as if the filter had matched, which is worse than an error.

`check_request` is an app-wide dependency: it reads only the matched route's declared query
parameters (its whole dependency tree, aliases included) and the request's Content-Type, so it
needs no per-route list that could drift from the routes themselves.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from api.browser import STREAM_TOKEN_PARAM, misused
from engine.errors import EngineError

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class UnsupportedMediaType(EngineError):
    code = "UNSUPPORTED_MEDIA_TYPE"
    http_status = 415
    title = "Unsupported media type"


class QueryPrefix:
    """A dependency taking every query parameter named `<prefix><key>` (a family of names no
    list of parameters can declare, e.g. `metadata.<key>`), as (key, value) pairs in request
    order, repeats kept. A route declares the family by depending on it; `check_request`
    then accepts those names on that route only."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self, request: Request) -> list[tuple[str, str]]:
        n = len(self.prefix)
        return [
            (k[n:], v) for k, v in request.query_params.multi_items() if k.startswith(self.prefix)
        ]


def _declared_query(route: APIRoute) -> tuple[frozenset[str], tuple[str, ...]]:
    """The query parameter names the route takes and the name prefixes it takes (its
    `QueryPrefix` dependencies), cached on the route: routes never change."""
    cached: tuple[frozenset[str], tuple[str, ...]] | None = getattr(route, "_aijobs_query", None)
    if cached is None:
        names: set[str] = set()
        prefixes: set[str] = set()
        stack: list[Dependant] = [route.dependant]
        while stack:
            dep = stack.pop()
            names |= {p.alias for p in dep.query_params}
            if isinstance(dep.call, QueryPrefix):
                prefixes.add(dep.call.prefix)
            stack.extend(dep.dependencies)
        cached = (frozenset(names), tuple(sorted(prefixes)))
        route._aijobs_query = cached  # type: ignore[attr-defined]
    return cached


def is_json(content_type: str | None) -> bool:
    """`application/json` or a `+json` type, parameters (charset) aside."""
    if not content_type:
        return False
    main = content_type.split(";", 1)[0].strip().lower()
    return main == "application/json" or (
        main.startswith("application/") and main.endswith("+json")
    )


def _has_body(request: Request) -> bool:
    length = request.headers.get("content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return "transfer-encoding" in request.headers


class HtmlRoute(APIRoute):
    """A route of HTML pages for people (the operator console, api/console/): not part of the
    JSON API, so neither of its refusals applies (a form posts form data; a shared link may
    carry parameters a page ignores)."""


async def check_request(request: Request) -> None:
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or isinstance(route, HtmlRoute):
        return
    declared, prefixes = _declared_query(route)
    if STREAM_TOKEN_PARAM in request.query_params and STREAM_TOKEN_PARAM not in declared:
        raise misused()  # a stream token opens the event streams only
    unknown = sorted(
        {k for k in request.query_params if k not in declared and not k.startswith(prefixes)}
    )
    if unknown:
        takes = sorted(declared) + [f"{p}<key>" for p in prefixes]
        raise RequestValidationError(
            [
                {
                    "loc": ("query", name),
                    "msg": "Unknown query parameter"
                    + (f"; this route takes: {', '.join(takes)}" if takes else ""),
                    "type": "extra_forbidden",
                }
                for name in unknown
            ]
        )
    if request.method in BODY_METHODS and route.body_field is not None:
        required = route.body_field.field_info.is_required()
        if (required or _has_body(request)) and not is_json(request.headers.get("content-type")):
            raise UnsupportedMediaType(
                "The request body must be JSON (Content-Type: application/json)."
            )
