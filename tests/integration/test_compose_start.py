"""Each engine service of docker-compose.yml, started for real: its command (`aijobs ...`) with
the environment compose would give it, the hosts `postgres` and `temporal` mapped to the test
session's servers. Every service starts; with one of its secrets removed, or its database or
Temporal unreachable, it refuses at start with one line naming the setting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from db.session import SessionMaker
from providers.crypto import generate_key_setting
from runtime.cli import build_parser
from runtime.embedded import free_port
from tests.compose_helpers import ENGINE_SERVICES, resolve
from tests.compose_helpers import command as _command
from tests.compose_helpers import compose_file as _compose

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# What an operator supplies (.env next to docker-compose.yml).
VARIABLES = {
    "JWT_SECRET": "compose-start-jwt-secret-" + "x" * 24,
    "DEEPSEEK_API_KEY": "sk-compose-start-never-called",
    "CREDENTIAL_ENCRYPTION_KEY": generate_key_setting("k1"),
}
LONG_RUNNING = ("api", "worker-interactive", "worker-background", "worker-system")


def service_env(
    name: str, variables: Mapping[str, str], local: Mapping[str, str]
) -> dict[str, str]:
    """The service's `environment:` as compose resolves it, its hosts mapped to local servers,
    plus what a test run needs (own task queues, no fixed metrics ports, no drain)."""
    env = resolve(_compose(), variables)["services"][name]["environment"]
    assert isinstance(env, dict), name
    resolved = {k: "" if v is None else str(v) for k, v in env.items()}
    assert resolved["DATABASE_URL"].startswith("postgresql://aijobs:aijobs@postgres:5432/")
    assert resolved["TEMPORAL_ADDRESS"] == "temporal:7233"
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        **resolved,
        **local,
    }


@pytest.fixture
def local(db: SessionMaker, database_url: str, temporal_address: str) -> dict[str, str]:
    return {
        "DATABASE_URL": database_url,
        "TEMPORAL_ADDRESS": temporal_address,
        "TASK_QUEUE_SUFFIX": f"-c{uuid.uuid4().hex[:8]}",
        "WORKER_METRICS_PORT": "0",
        "TEMPORAL_METRICS_PORT": "0",
        "WORKER_DRAIN_S": "0",
    }


def _argv(name: str, api_port: int) -> list[str]:
    command = _command(name)
    if name == "api":
        command[command.index("--port") + 1] = str(api_port)
        command[command.index("--host") + 1] = "127.0.0.1"
    return [sys.executable, "-m", "runtime.cli", *command]


def _run(name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _argv(name, 9), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[tuple[str, subprocess.Popen[bytes], Path]]]:
    procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    yield procs
    for _, p, _ in procs:
        if p.poll() is None:
            p.terminate()
    for _, p, _ in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def _ready(name: str, proc: subprocess.Popen[bytes], log: Path, api_port: int) -> bool:
    assert proc.poll() is None, f"{name} exited with {proc.returncode}: {log.read_text()[-2000:]}"
    if name == "api":
        try:
            return httpx.get(f"http://127.0.0.1:{api_port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False
    return "workers running" in log.read_text()


def test_every_engine_service_starts_with_its_compose_environment(
    local: dict[str, str],
    tmp_path: Path,
    started: list[tuple[str, subprocess.Popen[bytes], Path]],
) -> None:
    for name in ("migrate", "setup-temporal"):  # one-shot, before the others (depends_on)
        done = _run(name, service_env(name, VARIABLES, local))
        assert done.returncode == 0, (name, done.stderr[-2000:])
    api_port = free_port()
    for name in LONG_RUNNING:
        log = tmp_path / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                _argv(name, api_port),
                cwd=ROOT,
                env=service_env(name, VARIABLES, local),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        started.append((name, proc, log))
    waiting = {name for name, _, _ in started}
    deadline = time.monotonic() + 90
    while waiting and time.monotonic() < deadline:
        for name, proc, log in started:
            if name in waiting and _ready(name, proc, log, api_port):
                waiting.discard(name)
        time.sleep(0.3)
    assert not waiting, f"not started within 90 s: {sorted(waiting)}"
    for name, proc, log in started:
        proc.terminate()
        # A clean stop (uvicorn re-raises the SIGTERM it handled once it has shut down).
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM), (name, log.read_text()[-2000:])


def _refusals() -> list[tuple[str, str]]:
    """(service, secret) for each secret a service's process cannot start without."""
    services: dict[str, Any] = _compose()["services"]
    cases = []
    for name in ENGINE_SERVICES:
        env = services[name]["environment"]
        if "JWT_SECRET" in env:
            cases.append((name, "JWT_SECRET"))
        if "DEEPSEEK_API_KEY" in env and name.startswith("worker-"):
            cases.append((name, "DEEPSEEK_API_KEY"))
    return cases


def _refuse_in_process(
    name: str,
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """The service's command run in this process (what `aijobs` runs before connecting) with
    exactly `env`: the one line it refuses with (exit code 2)."""
    for var in list(os.environ):
        monkeypatch.delenv(var)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = build_parser().parse_args(_argv(name, 9)[3:])
    with pytest.raises(SystemExit) as info:
        args.func(args)
    assert info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_the_api_without_its_secret_exits_2_naming_it(local: dict[str, str]) -> None:
    env = service_env("api", VARIABLES, local)
    del env["JWT_SECRET"]  # past compose's own `:?` check
    done = _run("api", env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip() == (
        "aijobs api: refusing to start in production: JWT_SECRET is not set "
        "(set AIJOBS_ENV=development for a local stack)"
    )


@pytest.mark.parametrize(("name", "secret"), _refusals())
def test_a_service_without_a_secret_refuses_naming_it(
    name: str,
    secret: str,
    local: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = service_env(name, VARIABLES, local)
    # Past compose's own `:?` check (an empty or unset variable stops compose first): the
    # process itself must refuse, before it connects anywhere.
    del env[secret]
    env.pop("AI_BASE_URL", None)
    line = _refuse_in_process(name, env, monkeypatch, capsys)
    assert line.startswith(f"aijobs {_command(name)[0]}: refusing to start in production: ")
    assert secret in line
    for value in VARIABLES.values():
        assert value not in line


@pytest.mark.parametrize(
    ("name", "setting"),
    [
        ("migrate", "DATABASE_URL"),
        ("setup-temporal", "TEMPORAL_ADDRESS"),
        ("worker-system", "DATABASE_URL"),
        ("worker-interactive", "TEMPORAL_ADDRESS"),
        ("api", "DATABASE_DIRECT_URL"),
    ],
)
def test_a_service_that_cannot_reach_its_servers_refuses_naming_the_setting(
    name: str,
    setting: str,
    local: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    closed = free_port()
    unreachable = {
        "DATABASE_URL": f"postgresql://aijobs:hunter2-secret@127.0.0.1:{closed}/aijobs",
        "DATABASE_DIRECT_URL": f"postgresql://aijobs:hunter2-secret@127.0.0.1:{closed}/aijobs",
        "TEMPORAL_ADDRESS": f"127.0.0.1:{closed}",
    }
    env = service_env(name, VARIABLES, {**local, setting: unreachable[setting]})
    line = _refuse_in_process(name, env, monkeypatch, capsys)
    assert line.startswith(f"aijobs {_command(name)[0]}: refusing to start: {setting} (")
    assert "is not reachable" in line
    assert "hunter2" not in line
