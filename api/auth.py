"""Bearer JWT (HS256): `sub` is the user id, `roles` may hold SUPER_ADMIN, `org` (a string) and
`teams` (a list of strings; both named by JWT_ORG_CLAIM and JWT_TEAMS_CLAIM) the organisation and
teams whose budgets the user's jobs count in; `iat` and `exp` are required, the lifetime
`exp - iat` is bounded, and `iss`/`aud` are checked when configured.

A client sends the same token with every request until it expires, and checking its signature
and claims is most of what authentication costs a request. So a token that passed is
remembered (`_Verified`, at most `VERIFIED_CACHE_SIZE`, per configuration) with the window of
time in which every time-dependent check passes (`iat` and `nbf` minus the leeway, up to `exp`
plus the leeway); inside that window the same token gets the same principal without
re-checking, outside it (or unknown) it is checked in full, so every answer, and every refusal
with its reason, is what the full check gives. A refused token is never remembered.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import jwt

from api.schemas import storable_text
from engine.errors import Unauthenticated
from engine.scopes import MAX_TEAMS, is_scope_id, unique
from engine.settings import Settings

ADMIN_ROLE = "SUPER_ADMIN"
_INVALID = "The bearer token is invalid or expired."
# The longest lifetime (exp - iat) a token may have, `aijobs token --ttl` included: a month,
# so a leaked token is useless within one billing period.
MAX_TOKEN_TTL_S = 30 * 86_400
# Clock skew tolerated between the token's issuer and this API on `iat`, `nbf` and `exp`.
TOKEN_LEEWAY_S = 30


@dataclass(frozen=True)
class Principal:
    user_id: str
    roles: frozenset[str]
    org_id: str | None = None  # the token's organisation (None: none)
    team_ids: tuple[str, ...] = ()  # its teams, in the token's order, without repeats

    @property
    def is_admin(self) -> bool:
        return ADMIN_ROLE in self.roles


@dataclass(frozen=True)
class JwtConfig:
    """What signing and verifying a token needs; built from Settings by the entry points."""

    secret: str = field(repr=False)
    issuer: str | None = None
    audience: str | None = None
    max_ttl_s: int = MAX_TOKEN_TTL_S
    leeway_s: int = TOKEN_LEEWAY_S
    org_claim: str = "org"
    teams_claim: str = "teams"

    @classmethod
    def from_settings(cls, settings: Settings) -> JwtConfig:
        return cls(
            secret=settings.jwt_signing_secret,
            issuer=settings.jwt_issuer,
            audience=settings.jwt_audience,
            max_ttl_s=MAX_TOKEN_TTL_S,  # read when called: a test may patch them
            leeway_s=TOKEN_LEEWAY_S,
            org_claim=settings.jwt_org_claim,
            teams_claim=settings.jwt_teams_claim,
        )


# Tokens that passed, oldest first (dicts keep insertion order): a few MB at most.
VERIFIED_CACHE_SIZE = 8192


@dataclass(frozen=True)
class _Verified:
    principal: Principal
    valid_from: float  # time.time() at or after which iat and nbf pass (leeway included)
    valid_until: float  # time.time() before which exp passes (leeway included)


_verified: dict[tuple[JwtConfig, str], _Verified] = {}


def _config(config: JwtConfig | str) -> JwtConfig:
    return config if isinstance(config, JwtConfig) else JwtConfig(secret=config)


def issue_token(
    config: JwtConfig | str,
    user_id: str,
    *,
    admin: bool = False,
    ttl_s: int = 86_400,
    org: str | None = None,
    teams: tuple[str, ...] | list[str] = (),
) -> str:
    """Sign a token for `user_id` (of organisation `org` and `teams`, when given); a bare
    string is a secret with no issuer or audience. A lifetime over `max_ttl_s` is refused
    (verification would refuse the token); a negative one makes an already expired token, and
    an organisation or team id of another form one that verification refuses (ValueError)."""
    cfg = _config(config)
    if ttl_s > cfg.max_ttl_s:
        raise ValueError(f"a token's lifetime must be at most {cfg.max_ttl_s} seconds")
    for scope_id in [*([org] if org is not None else []), *teams]:
        if not is_scope_id(scope_id):
            raise ValueError("an organisation or team id is 1-64 characters of [A-Za-z0-9_.:-]")
    now = int(time.time())
    claims: dict[str, Any] = {
        "sub": user_id,
        "roles": [ADMIN_ROLE] if admin else [],
        "iat": now,
        "exp": now + ttl_s,
    }
    if org is not None:
        claims[cfg.org_claim] = org
    if teams:
        claims[cfg.teams_claim] = list(teams)
    if cfg.issuer:
        claims["iss"] = cfg.issuer
    if cfg.audience:
        claims["aud"] = cfg.audience
    return jwt.encode(claims, cfg.secret, algorithm="HS256")


def verify_token(config: JwtConfig | str, authorization: str | None) -> Principal:
    cfg = _config(config)
    if not authorization:
        raise Unauthenticated("A bearer token is required.")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("A bearer token is required.")
    key = (cfg, token)
    known = _verified.get(key)
    if known is not None and known.valid_from <= time.time() < known.valid_until:
        return known.principal
    principal, window = _verify(cfg, token)
    if len(_verified) >= VERIFIED_CACHE_SIZE:
        _verified.pop(next(iter(_verified), key), None)
    _verified[key] = _Verified(principal, *window)
    return principal


def _verify(cfg: JwtConfig, token: str) -> tuple[Principal, tuple[float, float]]:
    """The full check: the principal, and the time window in which the token passes."""
    required = ["sub", "iat", "exp"]
    if cfg.issuer:
        required.append("iss")
    if cfg.audience:
        required.append("aud")
    try:
        # Without a configured audience PyJWT refuses any token that carries one.
        claims = jwt.decode(
            token,
            cfg.secret,
            algorithms=["HS256"],
            options={"require": required, "verify_iat": True},
            issuer=cfg.issuer,
            audience=cfg.audience,
            leeway=cfg.leeway_s,
        )
    except jwt.PyJWTError:
        raise Unauthenticated(_INVALID) from None
    iat, exp = claims["iat"], claims["exp"]
    if not isinstance(iat, int | float) or not isinstance(exp, int | float):
        raise Unauthenticated(_INVALID)
    # Issued in the future (beyond the clock-skew leeway), or valid for longer than allowed.
    if iat > time.time() + cfg.leeway_s or exp - iat > cfg.max_ttl_s:
        raise Unauthenticated(_INVALID)
    sub = claims.get("sub")
    roles = claims.get("roles", [])
    # `sub` is compared with a text column: NUL or an unpaired surrogate would fail in the driver.
    if not isinstance(sub, str) or not sub or len(sub) > 128 or not storable_text(sub):
        raise Unauthenticated(_INVALID)
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise Unauthenticated(_INVALID)
    # PyJWT refuses `iat` or `nbf` (truncated to int) after now + leeway and `exp` at or before
    # now - leeway; the check above refuses a float `iat` after now + leeway.
    # (Python compares its ints and floats exactly, however large: no conversion here.)
    starts = [iat, int(iat)]
    if "nbf" in claims:
        starts.append(int(claims["nbf"]))
    window = (max(starts) - cfg.leeway_s, int(exp) + cfg.leeway_s)
    org, teams = _scopes(cfg, claims)
    return Principal(user_id=sub, roles=frozenset(roles), org_id=org, team_ids=teams), window


def _scopes(cfg: JwtConfig, claims: dict[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    """The token's organisation and teams (absent: none). A claim of another type, or an id of
    another form than 1-64 characters of `[A-Za-z0-9_.:-]`, refuses the token: it would name a
    budget nobody set, or none, and move spend where it does not belong."""
    org = claims.get(cfg.org_claim)
    teams = claims.get(cfg.teams_claim, [])
    if cfg.org_claim not in claims:
        org = None
    elif not is_scope_id(org):
        raise Unauthenticated(_INVALID)
    if not isinstance(teams, list) or len(teams) > MAX_TEAMS:
        raise Unauthenticated(_INVALID)
    if not all(is_scope_id(t) for t in teams):
        raise Unauthenticated(_INVALID)
    return org, unique(teams)
