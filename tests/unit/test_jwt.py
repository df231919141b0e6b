"""Bearer tokens signed and verified without a server: issuer, audience, `iat`, lifetime, leeway."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import jwt
import pytest

from api import auth
from api.auth import JwtConfig, Principal, issue_token, verify_token
from engine.errors import Unauthenticated
from engine.settings import Settings

SECRET = "unit-test-jwt-secret-of-at-least-32-bytes"
CFG = JwtConfig(secret=SECRET, max_ttl_s=3600, leeway_s=30)
SCOPED = JwtConfig(
    secret=SECRET, issuer="https://auth.example", audience="ai-jobs", max_ttl_s=3600, leeway_s=30
)


def _raw(claims: dict[str, Any], secret: str = SECRET) -> str:
    return "Bearer " + jwt.encode(claims, secret, algorithm="HS256")


def _claims(**over: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"sub": "alice", "roles": [], "iat": now, "exp": now + 600, **over}


def _refused(config: JwtConfig, authorization: str) -> None:
    with pytest.raises(Unauthenticated) as info:
        verify_token(config, authorization)
    assert "invalid or expired" in str(info.value)


def test_issue_and_verify_round_trip() -> None:
    p = verify_token(CFG, "Bearer " + issue_token(CFG, "alice", admin=True, ttl_s=600))
    assert p.user_id == "alice" and p.is_admin
    claims = jwt.decode(issue_token(CFG, "bob", ttl_s=60), options={"verify_signature": False})
    assert claims.keys() == {"sub", "roles", "iat", "exp"}  # no iss/aud unless configured


def test_issue_sets_issuer_and_audience_when_configured() -> None:
    token = issue_token(SCOPED, "alice", ttl_s=600)
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["iss"] == "https://auth.example" and claims["aud"] == "ai-jobs"
    assert claims["exp"] - claims["iat"] == 600
    assert verify_token(SCOPED, "Bearer " + token).user_id == "alice"


def test_a_bare_secret_is_a_config_without_issuer_or_audience() -> None:
    token = issue_token(SECRET, "alice")  # one day, within the default 30-day maximum
    assert verify_token(SECRET, f"Bearer {token}").user_id == "alice"
    _refused(CFG, f"Bearer {token}")  # over this config's one-hour maximum


@pytest.mark.parametrize(
    "over",
    [
        {},  # neither
        {"iss": "https://auth.example"},  # no aud
        {"aud": "ai-jobs"},  # no iss
        {"iss": "https://evil.example", "aud": "ai-jobs"},
        {"iss": "https://auth.example", "aud": "another-service"},
        {"iss": "https://auth.example", "aud": ["another-service"]},
    ],
)
def test_issuer_and_audience_mismatch_is_refused(over: dict[str, Any]) -> None:
    _refused(SCOPED, _raw(_claims(**over)))


def test_audience_list_containing_ours_is_accepted() -> None:
    claims = _claims(iss="https://auth.example", aud=["other", "ai-jobs"])
    assert verify_token(SCOPED, _raw(claims)).user_id == "alice"


def test_a_token_scoped_to_an_audience_is_refused_by_a_server_without_one() -> None:
    _refused(CFG, _raw(_claims(aud="ai-jobs")))
    # ... and a token from our issuer is fine where no issuer is configured.
    assert verify_token(CFG, _raw(_claims(iss="https://auth.example"))).user_id == "alice"


def test_iat_is_required_and_numeric() -> None:
    claims = _claims()
    del claims["iat"]
    _refused(CFG, _raw(claims))
    _refused(CFG, _raw(_claims(iat=None)))
    _refused(CFG, _raw(_claims(iat="yesterday")))
    _refused(CFG, _raw(_claims(iat=str(int(time.time())))))


def test_a_lifetime_over_the_maximum_is_refused() -> None:
    now = int(time.time())
    _refused(CFG, _raw(_claims(iat=now, exp=now + 3601)))
    assert verify_token(CFG, _raw(_claims(iat=now, exp=now + 3600))).user_id == "alice"
    # Backdating iat does not buy a longer lifetime either.
    _refused(CFG, _raw(_claims(iat=now - 3000, exp=now + 1000)))
    with pytest.raises(ValueError, match="at most 3600 seconds"):
        issue_token(CFG, "alice", ttl_s=3601)


def test_iat_in_the_future_beyond_leeway_is_refused() -> None:
    now = int(time.time())
    _refused(CFG, _raw(_claims(iat=now + 120, exp=now + 600)))


def test_leeway_accepts_small_clock_skew() -> None:
    now = int(time.time())
    # Issued by a clock 10 s ahead of ours.
    assert verify_token(CFG, _raw(_claims(iat=now + 10, exp=now + 600))).user_id == "alice"
    # Expired 10 s ago by our clock: still inside the leeway...
    assert verify_token(CFG, _raw(_claims(iat=now - 300, exp=now - 10))).user_id == "alice"
    # ... but not 60 s ago, and not with no leeway at all.
    _refused(CFG, _raw(_claims(iat=now - 300, exp=now - 60)))
    strict = JwtConfig(secret=SECRET, max_ttl_s=3600, leeway_s=0)
    _refused(strict, _raw(_claims(iat=now - 300, exp=now - 10)))
    _refused(strict, _raw(_claims(iat=now + 10, exp=now + 600)))


def test_config_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings.model_validate(
        {
            "AIJOBS_ENV": "production",
            "JWT_SECRET": SECRET,
            "JWT_ISSUER": "https://auth.example",
            "JWT_AUDIENCE": "ai-jobs",
        }
    )
    cfg = JwtConfig.from_settings(s)
    assert cfg == JwtConfig(SECRET, "https://auth.example", "ai-jobs", 30 * 86_400, 30)
    assert SECRET not in repr(cfg)
    defaults = JwtConfig.from_settings(Settings.model_validate({"AIJOBS_ENV": "test"}))
    assert (defaults.issuer, defaults.audience) == (None, None)
    assert (defaults.max_ttl_s, defaults.leeway_s) == (30 * 86_400, 30)
    # The bounds are the module's constants, read when the config is built.
    monkeypatch.setattr(auth, "MAX_TOKEN_TTL_S", 7200)
    monkeypatch.setattr(auth, "TOKEN_LEEWAY_S", 5)
    cfg = JwtConfig.from_settings(s)
    assert cfg == JwtConfig(SECRET, "https://auth.example", "ai-jobs", 7200, 5)


# ---- tokens that passed are remembered (api/auth.py) --------------------------------------


@pytest.fixture(autouse=True)
def _forget_verified_tokens() -> Iterator[None]:
    auth._verified.clear()
    yield
    auth._verified.clear()


def _move_clocks(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Both clocks a check reads, ours (`time.time`) and PyJWT's (`datetime.now`), `seconds`
    ahead (or behind) the real one."""
    real = time.time
    monkeypatch.setattr(auth, "time", SimpleNamespace(time=lambda: real() + seconds))

    class Moved(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Moved:
            return cls.fromtimestamp(real() + seconds, tz)

    monkeypatch.setattr(jwt.api_jwt, "datetime", Moved)


def _answer(config: JwtConfig, authorization: str) -> Principal | str:
    try:
        return verify_token(config, authorization)
    except Unauthenticated as exc:
        return exc.public_message


def test_a_remembered_token_gets_the_answer_of_the_full_check() -> None:
    now = int(time.time())
    tokens = [
        _raw(_claims()),
        _raw(_claims(iat=now + 10, exp=now + 600)),  # issued by a clock ahead, in the leeway
        _raw(_claims(iat=now - 300, exp=now - 10)),  # expired, in the leeway
        _raw(_claims(iat=now - 300, exp=now - 60)),  # expired
        _raw(_claims(nbf=now + 20)),  # not before: in the leeway
        _raw(_claims(nbf=now + 60)),  # not before: refused
        _raw(_claims(nbf=str(now))),  # PyJWT reads a numeric string
        _raw(_claims(iat=now + 120, exp=now + 600)),
        _raw(_claims(), secret="another-secret-of-at-least-32-bytes-long"),
        "Bearer  " + issue_token(CFG, "bob", admin=True, ttl_s=600) + " ",
    ]
    for config in (CFG, SCOPED, JwtConfig(secret=SECRET, max_ttl_s=3600, leeway_s=0)):
        for token in tokens:
            auth._verified.clear()
            cold = _answer(config, token)
            assert _answer(config, token) == _answer(config, token) == cold, token


def test_only_tokens_that_passed_are_remembered_and_only_so_many() -> None:
    _refused(CFG, _raw(_claims(iat=now_plus(120))))
    assert auth._verified == {}
    token = issue_token(CFG, "alice", ttl_s=600)
    first = verify_token(CFG, f"Bearer {token}")
    assert verify_token(CFG, f"Bearer {token}") is first
    assert len(auth._verified) == 1
    # Per configuration: the same token under another is checked, and refused, on its own.
    _refused(JwtConfig(secret="another-secret-of-at-least-32-bytes-long"), f"Bearer {token}")
    for n in range(auth.VERIFIED_CACHE_SIZE + 10):
        verify_token(CFG, "Bearer " + issue_token(CFG, f"user-{n}", ttl_s=600))
    assert len(auth._verified) == auth.VERIFIED_CACHE_SIZE


def test_a_remembered_token_is_refused_once_it_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    now = int(time.time())
    token = _raw(_claims(iat=now, exp=now + 60))
    assert verify_token(CFG, token).user_id == "alice"
    _move_clocks(monkeypatch, 85)  # expired 25 s ago: inside the 30 s leeway
    assert verify_token(CFG, token).user_id == "alice"
    _move_clocks(monkeypatch, 95)
    _refused(CFG, token)
    _move_clocks(monkeypatch, 0)
    assert verify_token(CFG, token).user_id == "alice"


def test_a_token_from_the_future_passes_only_while_it_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = int(time.time())
    token = _raw(_claims(iat=now + 40, exp=now + 600))
    _refused(CFG, token)
    _move_clocks(monkeypatch, 15)  # 25 s before its iat: inside the leeway
    assert verify_token(CFG, token).user_id == "alice"
    _move_clocks(monkeypatch, 0)  # our clock went back: checked again, refused again
    _refused(CFG, token)
    not_before = _raw(_claims(nbf=now + 40))
    _move_clocks(monkeypatch, 15)
    assert verify_token(CFG, not_before).user_id == "alice"
    _move_clocks(monkeypatch, 5)
    _refused(CFG, not_before)


def now_plus(seconds: int) -> int:
    return int(time.time()) + seconds


# ---- organisation and teams ---------------------------------------------------------------


def test_org_and_teams_come_from_their_claims_and_repeats_are_dropped() -> None:
    p = verify_token(CFG, _raw(_claims(org="school-1", teams=["class-a", "b.2", "class-a"])))
    assert (p.org_id, p.team_ids) == ("school-1", ("class-a", "b.2"))
    plain = verify_token(CFG, _raw(_claims()))
    assert (plain.org_id, plain.team_ids) == (None, ())  # absent: no org, no team
    token = issue_token(CFG, "alice", org="o:1", teams=["t_1", "t-2"], ttl_s=600)
    assert verify_token(CFG, "Bearer " + token).team_ids == ("t_1", "t-2")
    with pytest.raises(ValueError, match="organisation or team id"):
        issue_token(CFG, "alice", teams=["no spaces"], ttl_s=600)


def test_the_claims_names_are_settings() -> None:
    named = JwtConfig.from_settings(
        Settings.model_validate(
            {"JWT_SECRET": SECRET, "JWT_ORG_CLAIM": "tenant", "JWT_TEAMS_CLAIM": "groups"}
        )
    )
    p = verify_token(named, _raw(_claims(tenant="acme", groups=["g1"], org="ignored")))
    assert (p.org_id, p.team_ids) == ("acme", ("g1",))
    issued = issue_token(named, "u", org="acme", teams=["g1"], ttl_s=600)
    assert jwt.decode(issued, options={"verify_signature": False}).keys() >= {"tenant", "groups"}


@pytest.mark.parametrize(
    "bad",
    [
        {"org": 7},
        {"org": ""},
        {"org": None},
        {"org": ["school-1"]},
        {"org": "a" * 65},
        {"org": "has space"},
        {"org": "ünï"},
        {"teams": "class-a"},
        {"teams": [1]},
        {"teams": ["ok", ""]},
        {"teams": ["x/y"]},
        {"teams": {"a": 1}},
        {"teams": ["t"] * 101},
    ],
)
def test_a_claim_of_another_type_or_form_is_refused(bad: dict[str, Any]) -> None:
    _refused(CFG, _raw(_claims(**bad)))
