"""Fuzzing every route of docs/api.md over real HTTP: fuzzed API input never yields a 5xx.
Hypothesis generates bodies, headers, path ids and query parameters; every answer must be below
500, and every error a problem+json with a `code` that leaks nothing.

Each generated call starts as a valid request (a real token, a well-formed body or filter, an
existing job) and then has up to two parts replaced by hostile values. A fully random request
would stop at the first gate (auth, JSON parsing) and never reach the create path or the SQL.

Hypothesis runs synchronously in a worker thread with a blocking httpx client, while the server
keeps running on the session event loop.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.types import default_catalog
from tests.e2e.conftest import LEAK_MARKERS, PROBLEM, Api

NASTY = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "synthetic\x00",
    "alice\x00",
    "\ud800",
    "x\udfffy",
    "' OR 1=1 --",
    "%00",
    "../../etc/passwd",
    "\u202e",
    "🙂",
    "\n\r",
    "null",
    "SUPER_ADMIN",
    "queued",
    "x" * 300,
    "9" * 40,
    "-1",
    "1e999",
    "2024-01-01T00:00:00Z",
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59-23:59",
    "00000000-0000-0000-0000-000000000000",
]
JOB_TYPES = sorted(jt.job_type for jt in default_catalog())
SYNTHETIC_FIELDS = ["delayMs", "failTimes", "failCode", "hang", "invalidOutput", "echo", "other"]


@dataclass
class Call:
    method: str
    path: str
    params: list[tuple[str, str]] = field(default_factory=list)
    headers: dict[str, bytes] = field(default_factory=dict)
    content: bytes | None = None

    def describe(self) -> str:
        body = f" body={self.content[:300]!r}" if self.content else ""
        return f"{self.method} {self.path} params={self.params!r} headers={self.headers!r}{body}"


@dataclass(frozen=True)
class World:
    """Jobs and tokens that exist before a fuzz run."""

    job_ids: list[str]
    tokens: list[bytes]  # valid: a user, another user, an admin
    admin: bytes
    bad: list[bytes]


# ---- values ----------------------------------------------------------------------------------


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Picks a strategy in proportion to its weight (`one_of` flattens nested choices, so its
    branches do not weigh what they seem to)."""
    pool = [s for weight, s in choices for _ in range(weight)]
    return st.sampled_from(pool).flatmap(lambda s: s)


text = weighted((2, st.sampled_from(NASTY)), (1, st.text(max_size=24)))
# Query strings and paths travel as percent-encoded UTF-8: no lone surrogates there.
url_nasty = st.sampled_from([s for s in NASTY if "\ud800" not in s and "\udfff" not in s])
url_text = weighted((2, url_nasty), (1, st.text(st.characters(codec="utf-8"), max_size=24)))
# Header values as the wire carries them: latin-1 bytes, no CR/LF/NUL, no edge whitespace.
header_bytes = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=48
).map(lambda s: s.strip(" \t").encode("latin-1"))
slug = st.from_regex(r"[a-z][a-z0-9_-]{0,15}", fullmatch=True)
leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63, -(2**63) - 1, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
)


def _nest(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = {"a": value} if i % 2 else [value]
    return value


json_value = st.one_of(
    st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)
        ),
        max_leaves=12,
    ),
    st.integers(1, 400).map(_nest),  # deeper than any sane input
)
offsets = st.integers(-1439, 1439).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))
aware_time = st.datetimes(timezones=offsets).map(dt.datetime.isoformat)
any_time = st.one_of(aware_time, st.datetimes().map(dt.datetime.isoformat))


def _cursor(when: str, tail: str) -> str:
    return base64.urlsafe_b64encode(f"{when}|{tail}".encode()).decode().rstrip("=")


valid_cursor = st.builds(_cursor, aware_time, st.uuids().map(str))
hostile_cursor = st.one_of(
    url_text,
    st.builds(_cursor, st.one_of(any_time, url_text), st.one_of(st.uuids().map(str), url_text)),
)
hostile_query = weighted(
    (4, url_text), (1, any_time), (1, st.integers().map(str)), (1, hostile_cursor)
)
valid_synthetic_input = st.fixed_dictionaries(
    {},
    optional={
        "delayMs": st.integers(0, 5_000),
        "failTimes": st.integers(0, 3),
        "failCode": st.from_regex(r"[A-Z][A-Z0-9_]{1,20}", fullmatch=True),
        "hang": st.booleans(),
        "invalidOutput": st.booleans(),
        "echo": st.dictionaries(text, json_value, max_size=3),
    },
)
other_content_types = st.one_of(
    st.none(),
    st.sampled_from(
        [
            b"application/json; charset=latin-1",
            b"text/plain",
            b"application/x-www-form-urlencoded",
            b"multipart/form-data; boundary=x",
        ]
    ),
    header_bytes,
)


def hostile_auth(w: World) -> st.SearchStrategy[bytes | None]:
    return st.one_of(
        st.none(),
        st.sampled_from(w.bad),
        header_bytes.map(lambda b: b"Bearer " + b if b else b"Bearer"),
        header_bytes,
    )


def _set(headers: dict[str, bytes], name: str, value: bytes | None) -> None:
    if value is None:
        headers.pop(name, None)
    else:
        headers[name] = value


# ---- calls -------------------------------------------------------------------------------------

CREATE_TARGETS = [
    "auth",
    "content-type",
    "idempotency-key",
    "raw-body",
    "whole-body",
    "drop-member",
    "extra-member",
    "jobType",
    "targetType",
    "targetId",
    "input",
    "input-member",
    "priority",
    "credentialMode",
]


@st.composite
def create_calls(draw: st.DrawFn, w: World) -> Call:
    body: dict[str, Any] = {
        "jobType": draw(st.sampled_from(["synthetic", "synthetic", *JOB_TYPES])),
        "targetType": draw(slug),
        "targetId": draw(slug),
        "input": draw(valid_synthetic_input),
    }
    if draw(st.booleans()):
        body["priority"] = draw(st.integers(0, 100))
    headers = {
        "Authorization": draw(st.sampled_from(w.tokens)),
        "Content-Type": b"application/json",
    }
    if draw(st.booleans()):
        keys = st.sampled_from([b"dup-1", b"dup-2"])  # replays and reuses
        headers["Idempotency-Key"] = draw(
            st.one_of(keys, st.from_regex(r"[\x21-\x7e]{1,24}", fullmatch=True).map(str.encode))
        )
    doc: Any = body
    raw: bytes | None = None
    for target in draw(st.lists(st.sampled_from(CREATE_TARGETS), max_size=2)):
        if target == "auth":
            _set(headers, "Authorization", draw(hostile_auth(w)))
        elif target == "content-type":
            _set(headers, "Content-Type", draw(other_content_types))
        elif target == "idempotency-key":
            headers["Idempotency-Key"] = draw(header_bytes)
        elif target == "raw-body":
            raw = draw(st.binary(max_size=96))
        elif target == "whole-body":
            doc = draw(json_value)
        elif target == "drop-member":
            body.pop(draw(st.sampled_from(sorted(body))), None)
        elif target == "extra-member":
            body[draw(text)] = draw(json_value)
        elif target == "input-member":
            inp = body.setdefault("input", {})
            if isinstance(inp, dict):
                inp[draw(st.sampled_from(SYNTHETIC_FIELDS))] = draw(json_value)
        else:
            body[target] = draw(json_value)
    content = raw if raw is not None else json.dumps(doc).encode()  # NaN allowed, as Python's is
    return Call("POST", "/api/ai/jobs", [], headers, content)


USER_FILTERS: dict[str, st.SearchStrategy[str]] = {
    "status": st.sampled_from(["queued", "running", "succeeded", "failed", "cancelled"]),
    "jobType": st.sampled_from(JOB_TYPES),
    "cursor": valid_cursor,
    "limit": st.integers(1, 100).map(str),
}
ADMIN_FILTERS: dict[str, st.SearchStrategy[str]] = {
    **USER_FILTERS,
    "queueName": st.sampled_from(["ai-interactive", "ai-background"]),
    "userId": st.sampled_from(["alice", "bob", "root"]),
    "createdFrom": aware_time,
    "createdTo": aware_time,
}


@st.composite
def list_calls(
    draw: st.DrawFn, w: World, path: str, filters: dict[str, st.SearchStrategy[str]], admin: bool
) -> Call:
    params = {name: draw(v) for name, v in filters.items() if draw(st.booleans())}
    headers = {"Authorization": w.admin if admin else draw(st.sampled_from(w.tokens))}
    stray: list[tuple[str, str]] = []
    targets = st.sampled_from([*filters, *filters, "auth", "stray"])
    for target in draw(st.lists(targets, min_size=1, max_size=2)):
        if target == "auth":
            _set(headers, "Authorization", draw(hostile_auth(w)))
        elif target == "stray":
            stray.append((draw(url_text), draw(url_text)))
        else:
            params[target] = draw(hostile_query)
    return Call("GET", path, [*params.items(), *stray], headers)


@st.composite
def job_calls(draw: st.DrawFn, w: World, method: str, template: str, admin: bool) -> Call:
    job = draw(st.sampled_from(w.job_ids))
    headers = {"Authorization": w.admin if admin else draw(st.sampled_from(w.tokens))}
    params: list[tuple[str, str]] = []
    content: bytes | None = None
    for target in draw(st.lists(st.sampled_from(["auth", "id", "query", "body"]), max_size=2)):
        if target == "auth":
            _set(headers, "Authorization", draw(hostile_auth(w)))
        elif target == "id":
            job = draw(st.one_of(st.uuids().map(str), url_text))
        elif target == "query":
            params.append((draw(url_text), draw(url_text)))
        else:
            content = draw(
                st.one_of(st.binary(max_size=64), json_value.map(json.dumps).map(str.encode))
            )
            _set(
                headers,
                "Content-Type",
                draw(st.one_of(st.just(b"application/json"), other_content_types)),
            )
    return Call(method, template.format(quote(job, safe="")), params, headers, content)


@st.composite
def stray_calls(draw: st.DrawFn, w: World) -> Call:
    """Any method on known and unknown paths (health, docs, typos)."""
    path = draw(
        st.one_of(
            st.sampled_from(
                [
                    "/healthz",
                    "/readyz",
                    "/openapi.json",
                    "/docs",
                    "/api/ai/jobs",
                    "/api/ai/jobs/",
                    "/admin-api/ai/jobs",
                    f"/api/ai/jobs/{w.job_ids[0]}/retry",
                    f"/admin-api/ai/jobs/{w.job_ids[0]}/cancel",
                ]
            ),
            st.lists(url_text.filter(bool), min_size=1, max_size=4).map(
                lambda segs: "/" + "/".join(quote(s, safe="") for s in segs)
            ),
        )
    )
    method = draw(st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]))
    headers: dict[str, bytes] = {}
    _set(headers, "Authorization", draw(st.one_of(st.sampled_from(w.tokens), hostile_auth(w))))
    content = draw(st.one_of(st.none(), st.binary(max_size=64)))
    return Call(method, path, [], headers, content)


# ---- the runner --------------------------------------------------------------------------------


def check(call: Call, r: httpx.Response) -> None:
    where = f"{call.describe()}\n  -> {r.status_code} {r.text[:400]}"
    assert r.status_code < 500, where
    if r.status_code < 400 or call.method == "HEAD":
        return
    assert r.headers.get("content-type", "").startswith(PROBLEM), where
    body = r.json()
    assert body["status"] == r.status_code and isinstance(body["code"], str), where
    assert all(isinstance(body.get(m), str) for m in ("type", "title", "detail")), where
    asked = call.describe()
    for marker in LEAK_MARKERS:
        assert marker not in r.text or marker in asked, f"{marker!r} leaked: {where}"


def run_fuzz(api: Api, calls: st.SearchStrategy[Call], max_examples: int) -> None:
    with httpx.Client(base_url=api.base_url, timeout=30) as client:

        @settings(
            max_examples=max_examples,
            deadline=None,
            database=None,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.large_base_example,
            ],
        )
        @given(call=calls)
        def one(call: Call) -> None:
            r = client.request(
                call.method,
                call.path,
                params=tuple(call.params),
                headers=[(k.encode(), v) for k, v in call.headers.items()],
                content=call.content,
            )
            check(call, r)

        one()


async def world_for(api: Api) -> World:
    queued = await api.create_id("alice")
    cancelled = await api.create_id("alice")
    assert (await api.cancel(cancelled)).status_code == 200
    theirs = await api.create_id("bob")
    return World(
        job_ids=[queued, cancelled, theirs],
        tokens=[
            f"Bearer {api.token(u, admin=u == 'root')}".encode() for u in ("alice", "bob", "root")
        ],
        admin=f"Bearer {api.token('root', admin=True)}".encode(),
        bad=[
            api.expired()["Authorization"].encode(),
            api.forged()["Authorization"].encode(),
            b"Bearer a.b.c",
            b"Basic Og==",
        ],
    )


async def fuzz(api: Api, calls: Any, max_examples: int) -> None:
    world = await world_for(api)
    await asyncio.to_thread(run_fuzz, api, calls(world), max_examples)
    # The server is still healthy afterwards.
    assert (await api.http.get("/readyz")).status_code == 200


# ---- one test per route ------------------------------------------------------------------------


async def test_fuzz_create(api: Api) -> None:
    await fuzz(api, create_calls, 400)


async def test_fuzz_get_and_cancel_job(api: Api) -> None:
    def calls(w: World) -> st.SearchStrategy[Call]:
        return st.one_of(
            job_calls(w, "GET", "/api/ai/jobs/{}", admin=False),
            job_calls(w, "POST", "/api/ai/jobs/{}/cancel", admin=False),
        )

    await fuzz(api, calls, 150)


async def test_fuzz_list_jobs(api: Api) -> None:
    await fuzz(api, lambda w: list_calls(w, "/api/ai/jobs", USER_FILTERS, admin=False), 300)


async def test_fuzz_admin_list(api: Api) -> None:
    await fuzz(api, lambda w: list_calls(w, "/admin-api/ai/jobs", ADMIN_FILTERS, admin=True), 400)


async def test_fuzz_admin_get_and_retry(api: Api) -> None:
    def calls(w: World) -> st.SearchStrategy[Call]:
        return st.one_of(
            job_calls(w, "GET", "/admin-api/ai/jobs/{}", admin=True),
            job_calls(w, "POST", "/admin-api/ai/jobs/{}/retry", admin=True),
        )

    await fuzz(api, calls, 150)


async def test_fuzz_any_method_and_path(api: Api) -> None:
    """Health, docs, unknown paths and wrong methods: never a 5xx either."""
    await fuzz(api, stray_calls, 150)
