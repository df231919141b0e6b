"""docker-compose.yml cannot be started here (no Docker engine); keep it honest by reading it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from runtime.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def _subcommands() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices)  # type: ignore[arg-type]


ENGINE_SERVICES = (
    "migrate",
    "setup-temporal",
    "api",
    "worker-interactive",
    "worker-background",
    "worker-system",
)


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
