"""Bearer JWT (HS256): `sub` is the user id, `roles` may hold SUPER_ADMIN, `exp` is required."""

from __future__ import annotations

import time
from dataclasses import dataclass

import jwt

from api.schemas import storable_text
from engine.errors import Unauthenticated

ADMIN_ROLE = "SUPER_ADMIN"


@dataclass(frozen=True)
class Principal:
    user_id: str
    roles: frozenset[str]

    @property
    def is_admin(self) -> bool:
        return ADMIN_ROLE in self.roles


def issue_token(secret: str, user_id: str, *, admin: bool = False, ttl_s: int = 86_400) -> str:
    now = int(time.time())
    claims = {
        "sub": user_id,
        "roles": [ADMIN_ROLE] if admin else [],
        "iat": now,
        "exp": now + ttl_s,
    }
    return jwt.encode(claims, secret, algorithm="HS256")


def verify_token(secret: str, authorization: str | None) -> Principal:
    if not authorization:
        raise Unauthenticated("A bearer token is required.")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("A bearer token is required.")
    try:
        claims = jwt.decode(
            token.strip(),
            secret,
            algorithms=["HS256"],
            options={"require": ["sub", "exp"]},
        )
    except jwt.PyJWTError:
        raise Unauthenticated("The bearer token is invalid or expired.") from None
    sub = claims.get("sub")
    roles = claims.get("roles", [])
    # `sub` is compared with a text column: NUL or an unpaired surrogate would fail in the driver.
    if not isinstance(sub, str) or not sub or len(sub) > 128 or not storable_text(sub):
        raise Unauthenticated("The bearer token is invalid or expired.")
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise Unauthenticated("The bearer token is invalid or expired.")
    return Principal(user_id=sub, roles=frozenset(roles))
