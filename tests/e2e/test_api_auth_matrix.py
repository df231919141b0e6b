"""Who may call what (docs/api.md), as a table: every route x {no token, bad token, expired token,
another user, the owner, an admin}.

- no / bad / expired token → 401 UNAUTHENTICATED (+ `WWW-Authenticate: Bearer`) on every route;
- admin routes without SUPER_ADMIN → 403 FORBIDDEN;
- someone else's job → 404 JOB_NOT_FOUND, byte-for-byte the answer for a job that does not exist;
- a refused call has no effect.
"""

from __future__ import annotations

import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

import jwt
import pytest
from sqlalchemy import text

from api.auth import MAX_TOKEN_TTL_S
from db.session import SessionMaker
from tests.e2e.conftest import Api, assert_problem, bearer, start_api

OWNER, OTHER, ADMIN = "alice", "bob", "root"
WHO = ("none", "bad", "expired", "other", "owner", "admin")


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # `{job}` is the owner's job
    job_state: str | None = None  # "queued" or "cancelled": the job the call is about


ROUTES = {
    "create": Route("POST", "/api/ai/jobs"),
    "get": Route("GET", "/api/ai/jobs/{job}", "queued"),
    "list": Route("GET", "/api/ai/jobs", "queued"),
    "cancel": Route("POST", "/api/ai/jobs/{job}/cancel", "queued"),
    "admin_list": Route("GET", "/admin-api/ai/jobs", "queued"),
    "admin_get": Route("GET", "/admin-api/ai/jobs/{job}", "queued"),
    "admin_retry": Route("POST", "/admin-api/ai/jobs/{job}/retry", "cancelled"),
    "quote": Route("POST", "/api/ai/jobs/quote"),
    "usage": Route("GET", "/api/ai/usage"),
    "job_usage": Route("GET", "/api/ai/jobs/{job}/usage", "queued"),
    "admin_usage": Route("GET", "/admin-api/ai/usage"),
}
WITH_BODY = ("create", "quote")

# The contract. A cell is the status, or (status, problem code).
U401 = (401, "UNAUTHENTICATED")
F403 = (403, "FORBIDDEN")
N404 = (404, "JOB_NOT_FOUND")
EXPECTED: dict[str, tuple[Any, ...]] = {
    #               none  bad   expired other owner admin
    "create": (U401, U401, U401, 202, 202, 202),
    "get": (U401, U401, U401, N404, 200, 200),  # owner or admin
    "list": (U401, U401, U401, 200, 200, 200),  # each caller sees their own jobs
    "cancel": (U401, U401, U401, N404, 200, N404),  # owner only
    "admin_list": (U401, U401, U401, F403, F403, 200),
    "admin_get": (U401, U401, U401, F403, F403, 200),
    "admin_retry": (U401, U401, U401, F403, F403, 201),
    "quote": (U401, U401, U401, 200, 200, 200),  # each caller's own budgets; creates nothing
    "usage": (U401, U401, U401, 200, 200, 200),  # each caller's own spend
    "job_usage": (U401, U401, U401, N404, 200, 200),  # owner or admin, as the job itself
    "admin_usage": (U401, U401, U401, F403, F403, 200),
}
CASES = [(route, who) for route in ROUTES for who in WHO]


def headers_for(api: Api, who: str) -> dict[str, str]:
    return {
        "none": {},
        "bad": api.forged(OWNER),  # admin claims, signed with another secret
        "expired": api.expired(ADMIN),
        "other": api.as_user(OTHER),
        "owner": api.as_user(OWNER),
        "admin": api.as_admin(ADMIN),
    }[who]


async def state_of(db: SessionMaker) -> list[tuple[str, str, str]]:
    async with db() as s:
        rows = await s.execute(
            text("SELECT id::text, user_id, lifecycle_status FROM ai_job ORDER BY id")
        )
        return [(r[0], r[1], r[2]) for r in rows]


@pytest.mark.parametrize(("route", "who"), CASES, ids=[f"{r}-{w}" for r, w in CASES])
async def test_route_access(api: Api, db: SessionMaker, route: str, who: str) -> None:
    spec = ROUTES[route]
    job = await api.create_id(OWNER)
    if spec.job_state == "cancelled":
        assert (await api.cancel(job, OWNER)).status_code == 200
    before = await state_of(db)

    body = {"jobType": "synthetic", "targetType": "lesson", "targetId": "m1", "input": {}}
    r = await api.http.request(
        spec.method,
        spec.path.format(job=job),
        headers=headers_for(api, who),
        json=body if route in WITH_BODY else None,
    )

    want = EXPECTED[route][WHO.index(who)]
    if isinstance(want, tuple):
        assert_problem(r, *want)
        if want[0] == 401:
            assert r.headers["www-authenticate"] == "Bearer"
        # A refused call changes nothing.
        assert await state_of(db) == before
        return
    assert r.status_code == want, r.text
    data = r.json()
    caller = {"other": OTHER, "owner": OWNER, "admin": ADMIN}[who]
    if route == "create":
        assert (await api.admin_get(data["jobId"]))["userId"] == caller
    elif route == "get":
        assert data["jobId"] == job
    elif route == "list":
        listed = [item["jobId"] for item in data["items"]]
        assert listed == ([job] if who == "owner" else [])
    elif route == "cancel":
        assert data["lifecycleStatus"] == "cancelled"
    elif route == "admin_list":
        assert [item["jobId"] for item in data["items"]] == [job]
        assert data["items"][0]["userId"] == OWNER
    elif route == "admin_get":
        assert data["jobId"] == job and data["userId"] == OWNER
    elif route == "quote":
        assert data["admitted"] is True and data["jobType"] == "synthetic"
        assert await state_of(db) == before  # a quote creates nothing
    elif route in ("usage", "admin_usage"):
        assert data["total"]["calls"] == 0 and data["items"] == []
    elif route == "job_usage":
        assert data["jobId"] == job and data["calls"] == 0
    elif route == "admin_retry":
        assert data["retriedFromJobId"] == job
        assert (await api.admin_get(data["jobId"]))["userId"] == OWNER


@pytest.mark.parametrize("action", ["get", "cancel"])
async def test_someone_elses_job_is_indistinguishable_from_a_missing_one(
    api: Api, db: SessionMaker, action: str
) -> None:
    job = await api.create_id(OWNER)
    method, suffix = ("GET", "") if action == "get" else ("POST", "/cancel")
    theirs = await api.http.request(
        method, f"/api/ai/jobs/{job}{suffix}", headers=api.as_user(OTHER)
    )
    missing = await api.http.request(
        method, f"/api/ai/jobs/{uuid.uuid4()}{suffix}", headers=api.as_user(OTHER)
    )
    assert_problem(theirs, 404, "JOB_NOT_FOUND")
    assert theirs.content == missing.content
    assert dict(theirs.headers).keys() == dict(missing.headers).keys()
    assert (await api.get(job, OWNER))["lifecycleStatus"] == "queued"


def _token(secret: str, claims: dict[str, Any], *, alg: str = "HS256") -> str:
    return jwt.encode(claims, secret, algorithm=alg)


def bad_authorizations(api: Api) -> dict[str, str]:
    """Authorization values that must all be refused with 401, whatever the route."""
    secret = api.settings.jwt_signing_secret
    now = int(time.time())
    ok = {"sub": OWNER, "roles": ["SUPER_ADMIN"], "iat": now, "exp": now + 600}
    # PyJWT takes no key for algorithm "none"; its stub requires one.
    unsigned = jwt.encode(ok, key=None, algorithm="none")  # type: ignore[arg-type]
    with warnings.catch_warnings():  # the dev secret is short for HS512; that is the point
        warnings.simplefilter("ignore", jwt.InsecureKeyLengthWarning)
        hs512 = _token(secret, ok, alg="HS512")
    signed = {  # signed with the server's own secret, but with claims it must refuse
        "hs512": hs512,
        "no-exp": _token(secret, {"sub": OWNER, "roles": []}),
        "no-sub": _token(secret, {"exp": now + 600}),
        "empty-sub": _token(secret, {**ok, "sub": ""}),
        "int-sub": _token(secret, {**ok, "sub": 42}),
        "long-sub": _token(secret, {**ok, "sub": "u" * 129}),
        "nul-sub": _token(secret, {**ok, "sub": "ali\x00ce"}),
        "surrogate-sub": _token(secret, {**ok, "sub": "ali\ud800ce"}),
        "roles-not-a-list": _token(secret, {**ok, "roles": "SUPER_ADMIN"}),
        "expired": _token(secret, {**ok, "exp": now - 60}),
        "not-yet-valid": _token(secret, {**ok, "nbf": now + 600}),
        "no-iat": _token(secret, {"sub": OWNER, "roles": [], "exp": now + 600}),
        "string-iat": _token(secret, {**ok, "iat": str(now)}),
        "future-iat": _token(secret, {**ok, "iat": now + 3600, "exp": now + 4200}),
        "too-long-lifetime": _token(secret, {**ok, "exp": now + MAX_TOKEN_TTL_S + 60}),
        "unexpected-aud": _token(secret, {**ok, "aud": "another-service"}),
    }
    return {
        "empty-bearer": "Bearer",
        "basic-scheme": "Basic YWxpY2U6cGFzc3dvcmQ=",
        "token-without-scheme": api.token(OWNER),
        "garbage": "Bearer not.a.jwt",
        "wrong-secret": bearer(_token("another-secret-" + "y" * 20, ok))["Authorization"],
        "alg-none": f"Bearer {unsigned}",
        **{name: f"Bearer {token}" for name, token in signed.items()},
    }


async def test_every_malformed_or_forged_token_is_401(api: Api, db: SessionMaker) -> None:
    job = await api.create_id(OWNER)
    failures: list[str] = []
    for name, authorization in bad_authorizations(api).items():
        for method, path in [
            ("GET", "/api/ai/jobs"),
            ("GET", f"/api/ai/jobs/{job}"),
            ("GET", "/admin-api/ai/jobs"),
            ("POST", f"/admin-api/ai/jobs/{job}/retry"),
        ]:
            r = await api.http.request(method, path, headers={"Authorization": authorization})
            if r.status_code != 401 or r.json().get("code") != "UNAUTHENTICATED":
                failures.append(f"{name} {method} {path}: {r.status_code} {r.text[:120]}")
    assert not failures, "\n".join(failures)
    assert len(await state_of(db)) == 1


async def test_public_routes_need_no_token(api: Api) -> None:
    for path in ("/healthz", "/readyz", "/openapi.json", "/docs"):
        r = await api.http.get(path)
        assert r.status_code == 200, (path, r.status_code)


async def test_admin_can_read_any_job_on_the_user_route_but_lists_only_its_own(
    api: Api,
) -> None:
    job = await api.create_id(OWNER)
    mine = await api.create_id(ADMIN)
    r = await api.http.get(f"/api/ai/jobs/{job}", headers=api.as_admin(ADMIN))
    assert r.status_code == 200 and r.json()["jobId"] == job
    r = await api.http.get("/api/ai/jobs", headers=api.as_admin(ADMIN))
    assert [i["jobId"] for i in r.json()["items"]] == [mine]


async def test_issuer_and_audience_are_checked_when_configured(db: SessionMaker, env: Any) -> None:
    settings = env(JWT_ISSUER="https://auth.example", JWT_AUDIENCE="ai-jobs")
    async with start_api(settings) as api:
        # Tokens from `issue_token` carry the configured issuer and audience.
        r = await api.http.get("/api/ai/jobs", headers=api.as_user(OWNER))
        assert r.status_code == 200, r.text
        secret = settings.jwt_signing_secret
        now = int(time.time())
        base = {"sub": OWNER, "roles": [], "iat": now, "exp": now + 600}
        iss, aud = {"iss": "https://auth.example"}, {"aud": "ai-jobs"}
        refused = {
            "neither": base,
            "no-aud": {**base, **iss},
            "no-iss": {**base, **aud},
            "other-iss": {**base, **aud, "iss": "https://evil.example"},
            "other-aud": {**base, **iss, "aud": "another-service"},
        }
        for name, claims in refused.items():
            r = await api.http.get("/api/ai/jobs", headers=bearer(_token(secret, claims)))
            assert r.status_code == 401, name
            assert_problem(r, 401, "UNAUTHENTICATED")
        both = bearer(_token(secret, {**base, **iss, **aud}))
        assert (await api.http.get("/api/ai/jobs", headers=both)).status_code == 200
