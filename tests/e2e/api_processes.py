"""Real `aijobs api` processes on the session's database, for the tests that need more than one
API process (the cluster-wide limits, flow control's decisions across processes)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from runtime.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
CLI_API = (sys.executable, "-m", "runtime.cli", "api", "--host", "127.0.0.1")


@contextlib.contextmanager
def api_processes(
    database_url: str, temporal_address: str, log_dir: Path, n: int = 2, **env: str
) -> Iterator[list[str]]:
    """`n` API processes on the session's database; yields their base URLs once each answers
    /healthz (the API serves while Temporal is away, so readiness is not awaited)."""
    base_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "AIJOBS_ENV": "test",
        "LOG_LEVEL": "WARNING",
        "DATABASE_URL": database_url,
        "TEMPORAL_ADDRESS": temporal_address,
        **env,
    }
    procs: list[subprocess.Popen[bytes]] = []
    urls = []
    try:
        for i in range(n):
            port = free_port()
            with open(log_dir / f"api-{i}.log", "ab") as out:
                procs.append(
                    subprocess.Popen(
                        [*CLI_API, "--port", str(port)],
                        cwd=ROOT,
                        env=base_env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        pending = set(urls)
        while pending and time.monotonic() < deadline:
            for i, p in enumerate(procs):
                assert p.poll() is None, (log_dir / f"api-{i}.log").read_text()[-2000:]
            for url in list(pending):
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        pending.discard(url)
            time.sleep(0.2)
        assert not pending, f"APIs not up: {pending}"
        yield urls
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
