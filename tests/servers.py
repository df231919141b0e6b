"""Servers of a test's own, for tests that stop and restart them: a PostgreSQL data dir and a
Temporal dev server with a database file, so both keep their state across a restart; and a
Temporal dev server with a dynamic config the session's must not carry (`temporal_with`); or
only a Temporal server of its own beside the session's PostgreSQL (`own_temporal`). The
session's servers (tests/conftest.py) stay undisturbed."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from db.migrate import upgrade
from runtime.embedded import (
    EmbeddedPostgres,
    TemporalDevServer,
    free_port,
    start_postgres,
    start_temporal,
)


class OwnServers:
    """Call the stop/start methods through `asyncio.to_thread` from async tests: they block."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.temporal_port = free_port()
        self.pg: EmbeddedPostgres | None = None
        self.temporal: TemporalDevServer | None = None

    @property
    def database_url(self) -> str:
        assert self.pg is not None, "PostgreSQL is not running"
        return self.pg.uri

    @property
    def temporal_address(self) -> str:
        assert self.temporal is not None, "Temporal is not running"
        return self.temporal.address

    def start_postgres(self) -> None:
        self.pg = start_postgres(self.base / "pg")

    def stop_postgres(self) -> None:
        if self.pg is not None:
            self.pg.stop()
            self.pg = None

    def start_temporal(self) -> None:
        """On the same port and database file each time."""
        self.temporal = start_temporal(
            port=self.temporal_port, ui_port=None, db_file=self.base / "temporal.db"
        )

    def stop_temporal(self) -> None:
        if self.temporal is not None:
            self.temporal.stop()
            self.temporal = None


@contextlib.contextmanager
def own_servers(prefix: str) -> Iterator[OwnServers]:
    """Both servers started (the schema migrated), and both stopped and deleted at the end."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o755)
    servers = OwnServers(base)
    try:
        servers.start_postgres()
        servers.start_temporal()
        upgrade(servers.database_url)
        yield servers
    finally:
        # Each stop on its own: a failing one must not leave the other server running.
        with contextlib.suppress(Exception):
            servers.stop_temporal()
        with contextlib.suppress(Exception):
            servers.stop_postgres()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def own_temporal(prefix: str) -> Iterator[OwnServers]:
    """Only a Temporal dev server of the test's own (with a database file: stopped and started
    again, it keeps its state and port), for a test that runs on the session's PostgreSQL."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    servers = OwnServers(base)
    try:
        servers.start_temporal()
        yield servers
    finally:
        with contextlib.suppress(Exception):
            servers.stop_temporal()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def temporal_with(**dynamic_config: object) -> Iterator[str]:
    """A Temporal dev server of its own (in memory) with `dynamic_config` (for keys with dots,
    pass a dict: `temporal_with(**{"limit.historyCount.suggestContinueAsNew": 8})`); its
    address. Stopped at the end."""
    args: list[str] = []
    for key, value in dynamic_config.items():
        args += ["--dynamic-config-value", f"{key}={value}"]
    server = start_temporal(port=free_port(), ui_port=None, db_file=None, extra_args=args)
    try:
        yield server.address
    finally:
        server.stop()
