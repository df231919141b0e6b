"""PgBouncer in transaction mode in front of a test's PostgreSQL (Debian's package, installed by
`make pgbouncer`): the pooler production deployments put in front of the database. Tests that
need it skip, saying why, only when it cannot be installed."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from db.session import libpq_url
from runtime.embedded import free_port

ROOT = Path(__file__).resolve().parents[1]


def pgbouncer_binary() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    return "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None


def ensure_pgbouncer() -> tuple[str | None, str]:
    """(the binary, "") or (None, why it could not be installed) after `make pgbouncer`."""
    binary = pgbouncer_binary()
    if binary:
        return binary, ""
    try:
        done = subprocess.run(
            ["make", "-s", "pgbouncer"], cwd=ROOT, capture_output=True, text=True, timeout=600
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"`make pgbouncer` could not run: {exc}"
    binary = pgbouncer_binary()
    if binary:
        return binary, ""
    return None, f"`make pgbouncer` did not install it: {(done.stderr or done.stdout)[-300:]}"


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = log.parent.parent / f"{log.parent.name}.stderr"
            raise RuntimeError(
                f"pgbouncer exited with {proc.returncode}: {err.read_text()[-800:]}"
                f"{log.read_text()[-800:]}"
            )
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        time.sleep(0.1)
    raise RuntimeError(f"pgbouncer did not listen within {timeout_s} s: {log.read_text()[-800:]}")


@contextlib.contextmanager
def pgbouncer(
    binary: str, database_url: str, workdir: Path, *, pool_size: int = 20
) -> Iterator[str]:
    """PgBouncer (transaction mode, `pool_size` server connections per database and user) in
    front of `database_url`; yields the URL of the same database through it. As root it runs
    as the owner of PostgreSQL's socket directory (it refuses to run as root)."""
    info = conninfo_to_dict(libpq_url(database_url))
    workdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="pgbouncer-", dir=workdir))
    # Traversable by the user it runs as (pytest's own temporary directories are not).
    for d in (workdir, *workdir.parents):
        if d == Path(tempfile.gettempdir()):
            break
        d.chmod(d.stat().st_mode | 0o755)
    host, port = str(info.get("host", "127.0.0.1")), str(info.get("port", 5432))
    user, dbname = str(info.get("user", "postgres")), str(info.get("dbname", "postgres"))
    workdir.mkdir(parents=True, exist_ok=True)
    listen = free_port()
    (workdir / "userlist.txt").write_text(f'"{user}" ""\n')
    log = workdir / "pgbouncer.log"
    (workdir / "pgbouncer.ini").write_text(
        f"""[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {workdir / "userlist.txt"}
pool_mode = transaction
max_client_conn = 2000
default_pool_size = {pool_size}
ignore_startup_parameters = extra_float_digits,options
server_reset_query =
logfile = {log}
"""
    )
    log.touch()
    argv = [binary, str(workdir / "pgbouncer.ini")]
    if os.geteuid() == 0:
        owner = Path(host).owner() if host.startswith("/") else "nobody"
        shutil.chown(workdir, owner)
        for f in workdir.iterdir():
            shutil.chown(f, owner)
        argv[1:1] = ["-u", owner]
    with open(workdir.parent / f"{workdir.name}.stderr", "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    try:
        _wait_port(listen, proc, log, 20)
        yield f"postgresql://{user}@127.0.0.1:{listen}/{dbname}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
