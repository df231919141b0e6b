"""Production unless told otherwise: which configurations each process refuses at start-up, with
one line naming the setting, before it connects to anything."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, get_args

import pytest

from engine.definition import QUEUE_NAMES
from engine.settings import (
    DEV_ENCRYPTION_KEY,
    DEV_JWT_SECRET,
    ConfigurationError,
    Role,
    Settings,
    current_key_is_development,
)
from jobs.credentials import credential_cipher
from providers.crypto import DEV_ENCRYPTION_KEY as CRYPTO_DEV_KEY
from providers.crypto import CredentialCipher, generate_key_setting
from runtime import cli
from runtime.devstack import TOKEN_TTL_S, use_development_environment
from tests.unit.settings_helpers import GOOD_SECRET, prod

ROOT = Path(__file__).resolve().parents[2]
PROVIDER_QUEUES = QUEUE_NAMES
ALL_ROLES: tuple[Role, ...] = get_args(Role)
# The public development key, spelled another way: other key id, urlsafe, no padding.
DEV_KEY_RESPELLED = "prod:" + DEV_ENCRYPTION_KEY.partition(":")[2].rstrip("=")


# ---- defaults ----------------------------------------------------------------------------


def test_the_environment_is_production_unless_set(environ: pytest.MonkeyPatch) -> None:
    s = Settings()
    assert s.environment == "production"
    assert s.jwt_secret is None and s.credential_encryption_key is None
    assert not s.synthetic_public and not s.platform_key_configured
    with pytest.raises(RuntimeError, match="JWT_SECRET"):
        _ = s.jwt_signing_secret


def test_an_empty_variable_is_unset(environ: pytest.MonkeyPatch) -> None:
    for name in ("AIJOBS_ENV", "JWT_SECRET", "CREDENTIAL_ENCRYPTION_KEY", "DEEPSEEK_API_KEY"):
        environ.setenv(name, "")
    environ.setenv("AI_BASE_URL", "")
    s = Settings()
    assert s.environment == "production"
    assert s.jwt_secret is None and s.credential_encryption_key is None
    assert s.deepseek_api_key is None and s.ai_base_url is None
    assert s.production_problems("api") == ["JWT_SECRET is not set"]


def test_the_development_key_lives_in_one_place() -> None:
    assert CRYPTO_DEV_KEY is DEV_ENCRYPTION_KEY
    # It is a real key of the keyring format, recognised whatever its id or spelling.
    assert CredentialCipher.from_setting(DEV_KEY_RESPELLED).current_key_id == "prod"
    assert current_key_is_development(DEV_ENCRYPTION_KEY)
    assert current_key_is_development(f" {DEV_KEY_RESPELLED} , {generate_key_setting('k0')}")
    # Retired further down the ring (a rotation away from it) is allowed.
    assert not current_key_is_development(f"{generate_key_setting('k2')},{DEV_ENCRYPTION_KEY}")
    assert not current_key_is_development("garbage")


# ---- the table ---------------------------------------------------------------------------

PROVIDER = {"DEEPSEEK_API_KEY": "sk-live-x"}
# (role, worker queues, environment beyond AIJOBS_ENV=production, expected problems)
CASES: list[tuple[Role, tuple[str, ...], dict[str, str], list[str]]] = [
    ("api", (), {}, ["JWT_SECRET is not set"]),
    ("api", (), {"JWT_SECRET": DEV_JWT_SECRET}, ["JWT_SECRET is the public development secret"]),
    ("api", (), {"JWT_SECRET": "x" * 31}, ["JWT_SECRET is shorter than 32 bytes"]),
    ("api", (), {"JWT_SECRET": "é" * 16}, []),  # 32 bytes of UTF-8
    ("api", (), {"JWT_SECRET": GOOD_SECRET}, []),
    (
        "api",
        (),
        {"JWT_SECRET": GOOD_SECRET, "CREDENTIAL_ENCRYPTION_KEY": DEV_ENCRYPTION_KEY},
        ["CREDENTIAL_ENCRYPTION_KEY is the public development key"],
    ),
    (
        "api",
        (),
        {"JWT_SECRET": GOOD_SECRET, "CREDENTIAL_ENCRYPTION_KEY": DEV_KEY_RESPELLED},
        ["CREDENTIAL_ENCRYPTION_KEY is the public development key"],
    ),
    (
        "api",
        (),
        {"CREDENTIAL_ENCRYPTION_KEY": DEV_ENCRYPTION_KEY},
        ["JWT_SECRET is not set", "CREDENTIAL_ENCRYPTION_KEY is the public development key"],
    ),
    # The API needs no provider: platform-key jobs answer 503 without one.
    ("api", (), {"JWT_SECRET": GOOD_SECRET, "CREDENTIAL_ENCRYPTION_KEY": "<k1>"}, []),
    ("token", (), {}, ["JWT_SECRET is not set"]),
    ("token", (), {"JWT_SECRET": DEV_JWT_SECRET}, ["JWT_SECRET is the public development secret"]),
    ("token", (), {"JWT_SECRET": "short"}, ["JWT_SECRET is shorter than 32 bytes"]),
    ("token", (), {"JWT_SECRET": GOOD_SECRET}, []),
    ("worker", ("ai-interactive",), {}, ["DEEPSEEK_API_KEY nor AI_BASE_URL"]),
    ("worker", ("ai-background",), {}, ["DEEPSEEK_API_KEY nor AI_BASE_URL"]),
    # No --queue: all queues, ai-system included.
    ("worker", (), {}, ["JWT_SECRET is not set", "DEEPSEEK_API_KEY nor AI_BASE_URL"]),
    # Bulk retries are creates: the platform provider and the fairness key's secret.
    ("worker", ("ai-system",), {}, ["JWT_SECRET is not set", "DEEPSEEK_API_KEY nor AI_BASE_URL"]),
    ("worker", ("ai-system",), {"JWT_SECRET": GOOD_SECRET, **PROVIDER}, []),
    ("worker", ("ai-interactive",), PROVIDER, []),
    ("worker", ("ai-interactive",), {"AI_BASE_URL": "http://llm.internal:8080/v1"}, []),
    (
        "worker",
        ("ai-interactive",),
        {**PROVIDER, "CREDENTIAL_ENCRYPTION_KEY": DEV_ENCRYPTION_KEY},
        ["CREDENTIAL_ENCRYPTION_KEY is the public development key"],
    ),
    (
        "worker",
        ("ai-system",),
        {"CREDENTIAL_ENCRYPTION_KEY": DEV_ENCRYPTION_KEY, "JWT_SECRET": GOOD_SECRET, **PROVIDER},
        ["CREDENTIAL_ENCRYPTION_KEY is the public development key"],
    ),
    ("worker", ("ai-interactive",), {"JWT_SECRET": DEV_JWT_SECRET, **PROVIDER}, []),
    ("rotate-keys", (), {}, ["CREDENTIAL_ENCRYPTION_KEY is not set"]),
    (
        "rotate-keys",
        (),
        {"CREDENTIAL_ENCRYPTION_KEY": DEV_ENCRYPTION_KEY},
        ["CREDENTIAL_ENCRYPTION_KEY is the public development key"],
    ),
    ("rotate-keys", (), {"CREDENTIAL_ENCRYPTION_KEY": f"<k1>,{DEV_ENCRYPTION_KEY}"}, []),
    *[(role, (), {}, []) for role in ("relay", "reconcile", "migrate", "setup-temporal")],
    ("outbox-dead", (), {"JWT_SECRET": DEV_JWT_SECRET}, []),
]


def _materialise(env: dict[str, str]) -> dict[str, str]:
    key = generate_key_setting("k1")
    return {name: value.replace("<k1>", key) for name, value in env.items()}


@pytest.mark.parametrize(
    ("role", "queues", "env", "expected"),
    CASES,
    ids=[f"{c[0]}{list(c[1]) if c[1] else ''}-{'+'.join(c[2]) or 'nothing'}" for c in CASES],
)
def test_production_refusals(
    role: Role, queues: tuple[str, ...], env: dict[str, str], expected: list[str]
) -> None:
    s = prod(**_materialise(env))
    problems = s.production_problems(role, queues=queues)
    assert len(problems) == len(expected), problems
    for problem, want in zip(problems, expected, strict=True):
        assert want in problem
    if not expected:
        s.check_startup(role, queues=queues)
        return
    with pytest.raises(ConfigurationError) as info:
        s.check_startup(role, queues=queues)
    line = str(info.value)
    assert "\n" not in line
    assert line.startswith("refusing to start in production: ")
    assert line.endswith("(set AIJOBS_ENV=development for a local stack)")
    for problem in problems:
        assert problem in line
    # Never the secret itself.
    for value in _materialise(env).values():
        if value not in ("", DEV_JWT_SECRET) and len(value) > 8:
            assert value not in line


@pytest.mark.parametrize("environment", ["development", "test"])
@pytest.mark.parametrize("role", ALL_ROLES)
def test_development_and_test_accept_the_defaults(environment: str, role: Role) -> None:
    s = Settings.model_validate({"AIJOBS_ENV": environment})
    assert s.production_problems(role) == []
    s.check_startup(role)
    assert s.jwt_signing_secret == DEV_JWT_SECRET
    assert s.platform_key_configured
    keyring = credential_cipher(s)
    assert keyring is not None and keyring.current_key_id == "dev"


def test_production_never_encrypts_under_the_development_key() -> None:
    with pytest.raises(ValueError, match="CREDENTIAL_ENCRYPTION_KEY"):
        credential_cipher(prod(CREDENTIAL_ENCRYPTION_KEY=DEV_KEY_RESPELLED))
    # Without a key, production stores no user keys (503) and workers decrypt none.
    assert credential_cipher(prod()) is None
    ring = credential_cipher(prod(CREDENTIAL_ENCRYPTION_KEY=generate_key_setting("k9")))
    assert ring is not None and ring.current_key_id == "k9"


# ---- `aijobs dev` ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after", "noted"),
    [
        (None, "development", False),
        ("", "development", False),
        ("development", "development", False),
        ("test", "test", False),
        ("TEST", "test", False),
        ("production", "development", True),
    ],
)
def test_dev_runs_as_development(before: str | None, after: str, noted: bool) -> None:
    env = {} if before is None else {"AIJOBS_ENV": before}
    note = use_development_environment(env)
    assert env["AIJOBS_ENV"] == after
    assert (note is not None) == noted
    if note:
        assert "AIJOBS_ENV=production ignored" in note


def test_dev_tokens_fit_the_default_maximum_lifetime() -> None:
    from api.auth import JwtConfig

    dev = Settings.model_validate({"AIJOBS_ENV": "development"})
    assert TOKEN_TTL_S <= JwtConfig.from_settings(dev).max_ttl_s


# ---- the CLI, in process -----------------------------------------------------------------


def _token_args(**over: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"user": "u", "admin": False, "ttl": 3600, **over})


def test_token_refuses_the_development_secret_in_production(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    environ.setenv("JWT_SECRET", DEV_JWT_SECRET)
    with pytest.raises(SystemExit) as info:
        cli.cmd_token(_token_args())
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip() == (
        "aijobs token: refusing to start in production: JWT_SECRET is the public development "
        "secret (set AIJOBS_ENV=development for a local stack)"
    )


@pytest.mark.parametrize("environment", ["development", "test"])
def test_token_signs_with_the_development_secret_outside_production(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], environment: str
) -> None:
    from api.auth import JwtConfig, verify_token

    environ.setenv("AIJOBS_ENV", environment)
    assert cli.cmd_token(_token_args(admin=True)) == 0
    token = capsys.readouterr().out.strip()
    principal = verify_token(JwtConfig(DEV_JWT_SECRET), f"Bearer {token}")
    assert principal.user_id == "u" and principal.is_admin


@pytest.mark.parametrize("ttl", [0, -5, 30 * 86_400 + 1])
def test_token_ttl_is_bounded(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], ttl: int
) -> None:
    environ.setenv("AIJOBS_ENV", "development")
    with pytest.raises(SystemExit) as info:
        cli.cmd_token(_token_args(ttl=ttl))
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "aijobs token: --ttl must be between 1 and 2592000 seconds (30 days)"
    )


def test_token_ttl_follows_the_longest_token_lifetime(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import api.auth

    environ.setenv("AIJOBS_ENV", "production")
    environ.setenv("JWT_SECRET", GOOD_SECRET)
    environ.setattr(api.auth, "MAX_TOKEN_TTL_S", 600)
    environ.setenv("JWT_ISSUER", "https://auth.example")
    assert cli.cmd_token(_token_args(ttl=600)) == 0
    import jwt

    claims = jwt.decode(
        capsys.readouterr().out.strip(),
        GOOD_SECRET,
        algorithms=["HS256"],
        issuer="https://auth.example",
    )
    assert claims["exp"] - claims["iat"] == 600
    with pytest.raises(SystemExit):
        cli.cmd_token(_token_args(ttl=601))
    assert "between 1 and 600 seconds" in capsys.readouterr().err


def test_an_invalid_setting_is_one_line(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    environ.setenv("AIJOBS_ENV", "prod")
    with pytest.raises(SystemExit) as info:
        cli.cmd_token(_token_args())
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("aijobs token: invalid configuration: AIJOBS_ENV: ")


@pytest.mark.parametrize("environment", ["development", "production"])
def test_a_malformed_keyring_is_refused_in_every_environment(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], environment: str
) -> None:
    environ.setenv("AIJOBS_ENV", environment)
    environ.setenv("JWT_SECRET", GOOD_SECRET)
    environ.setenv("CREDENTIAL_ENCRYPTION_KEY", "k1:not-base64!!")
    with pytest.raises(SystemExit) as info:
        cli._settings("api")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "aijobs api: refusing to start: CREDENTIAL_ENCRYPTION_KEY: "
        "encryption key 'k1' is not valid base64"
    )


# ---- the CLI, as a process ---------------------------------------------------------------


def _run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m runtime.cli ...` with nothing but PATH, HOME and `env`: no database, no
    Temporal (the checks must refuse before connecting)."""
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(ROOT), **env}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.cli", *argv],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 30
    return proc


DB = {"DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none"}


def test_cli_api_without_a_jwt_secret_exits_2() -> None:
    proc = _run("api", "--port", "9", **DB)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.strip() == (
        "aijobs api: refusing to start in production: JWT_SECRET is not set "
        "(set AIJOBS_ENV=development for a local stack)"
    )


def test_cli_worker_without_a_provider_exits_2() -> None:
    proc = _run("worker", "--queue", "ai-interactive", **DB)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("aijobs worker: refusing to start in production: ")
    assert "DEEPSEEK_API_KEY" in lines[0] and "AI_BASE_URL" in lines[0]


def test_cli_token_in_production_without_a_secret_refuses() -> None:
    proc = _run("token", "--user", "u")
    assert proc.returncode == 2
    assert proc.stdout == ""  # no token printed
    assert "JWT_SECRET is not set" in proc.stderr


def test_cli_token_in_production_with_the_development_secret_refuses() -> None:
    proc = _run("token", "--user", "u", JWT_SECRET=DEV_JWT_SECRET)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "JWT_SECRET is the public development secret" in proc.stderr


def test_cli_token_in_development_signs() -> None:
    proc = _run("token", "--user", "u", AIJOBS_ENV="development")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(".") == 2


# ---- behind a transaction pooler, and what a role connects to ----------------------------

POOLER = "postgresql://u@pgbouncer:6432/db"
DIRECT = "postgresql://u@postgres:5432/db"


@pytest.mark.parametrize(
    ("env", "pooled", "session_url"),
    [
        ({"DATABASE_URL": DIRECT}, False, DIRECT),
        ({"DATABASE_URL": POOLER, "DATABASE_DIRECT_URL": DIRECT}, True, DIRECT),
        ({"DATABASE_URL": DIRECT, "DATABASE_DIRECT_URL": DIRECT}, False, DIRECT),
        # DATABASE_POOLER is no longer read: behind a pooler, DATABASE_DIRECT_URL says so.
        ({"DATABASE_URL": POOLER, "DATABASE_POOLER": "true"}, False, POOLER),
        (
            {"DATABASE_URL": POOLER, "DATABASE_DIRECT_URL": DIRECT, "DATABASE_POOLER": "0"},
            True,
            DIRECT,
        ),
    ],
)
def test_the_pooler_settings(env: dict[str, str], pooled: bool, session_url: str) -> None:
    s = Settings.model_validate({"AIJOBS_ENV": "test", **env})
    assert s.database_pooled is pooled
    assert s.session_database_url == session_url


def test_each_role_names_what_it_cannot_reach() -> None:
    from runtime.embedded import free_port
    from runtime.startup import reachability_problems

    empty = Settings.model_validate({"AIJOBS_ENV": "test"})
    assert reachability_problems(empty, "api") == [
        "DATABASE_URL is not set",
        "TEMPORAL_ADDRESS is not set",
    ]
    assert reachability_problems(empty, "migrate") == ["DATABASE_URL is not set"]
    assert reachability_problems(empty, "setup-temporal") == ["TEMPORAL_ADDRESS is not set"]
    assert reachability_problems(empty, "token") == []
    closed = free_port()
    s = Settings.model_validate(
        {
            "AIJOBS_ENV": "test",
            "DATABASE_URL": f"postgresql://u:topsecret@127.0.0.1:{closed}/db",
            "TEMPORAL_ADDRESS": f"127.0.0.1:{closed}",
        }
    )
    problems = reachability_problems(s, "worker", wait_s=0)
    assert len(problems) == 2
    assert problems[0].startswith(f"DATABASE_URL (127.0.0.1:{closed}/db) is not reachable: ")
    assert problems[1].startswith(f"TEMPORAL_ADDRESS (127.0.0.1:{closed}) is not reachable: ")
    assert not any("topsecret" in p for p in problems)
