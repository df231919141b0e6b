"""What a process checks at start beyond its settings: that the database and Temporal its role
uses answer (engine/settings.py `NEEDS_DATABASE`, `NEEDS_TEMPORAL`). A process that cannot
reach them refuses to start with one line naming the setting, rather than failing at first use
(a worker that polls Temporal but cannot write a job's row, an API whose every request is 503).

Both are waited for up to STARTUP_WAIT_S (a database or Temporal still starting beside it), then
refused. The line names the setting and where it points (host, port, database), never a password.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from db.session import unreachable, where
from engine.settings import NEEDS_DATABASE, NEEDS_TEMPORAL, Role, Settings

# Between two attempts while waiting.
_RETRY_S = 0.5
# How long a starting process waits for its database and Temporal to answer before it refuses
# to start: long enough for servers started beside it (compose starts them together), short
# enough that a wrong address is reported while someone is still watching.
STARTUP_WAIT_S = 15.0


def _retry(wait_s: float, attempt: Callable[[float], str | None], problem: str) -> str | None:
    """None as soon as `attempt` (given its timeout) returns None; else, once `wait_s` is
    spent, `problem` with the last attempt's reason."""
    deadline = time.monotonic() + wait_s
    while True:
        why = attempt(max(1.0, min(5.0, deadline - time.monotonic())))
        if why is None:
            return None
        if time.monotonic() + _RETRY_S > deadline:
            return f"{problem}: {why}"
        time.sleep(_RETRY_S)


def database_problem(url: str, setting: str, wait_s: float) -> str | None:
    """None when `SELECT 1` answers on `url` within `wait_s`, else one phrase naming `setting`."""
    return _retry(
        wait_s,
        lambda timeout: unreachable(url, timeout),
        f"{setting} ({where(url)}) is not reachable",
    )


def temporal_problem(address: str, wait_s: float) -> str | None:
    """None when Temporal's frontend accepts a connection within `wait_s`."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return f"TEMPORAL_ADDRESS {address[:80]!r} is not host:port"

    def connect(timeout_s: float) -> str | None:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
        except OSError as exc:
            return (str(exc) or type(exc).__name__)[:200]
        return None

    return _retry(wait_s, connect, f"TEMPORAL_ADDRESS ({address[:80]}) is not reachable")


def reachability_problems(s: Settings, role: Role, *, wait_s: float = STARTUP_WAIT_S) -> list[str]:
    """What of its role's database and Temporal does not answer (waiting up to `wait_s` for
    each; 0: one attempt), one phrase per problem naming its setting; empty when all answer."""
    problems: list[str] = []
    if role in NEEDS_DATABASE:
        if not s.database_url:
            problems.append("DATABASE_URL is not set")
        elif problem := database_problem(s.database_url, "DATABASE_URL", wait_s):
            problems.append(problem)
        elif s.database_direct_url and s.database_direct_url != s.database_url:
            direct = database_problem(s.database_direct_url, "DATABASE_DIRECT_URL", wait_s)
            problems += [direct] if direct else []
    if role in NEEDS_TEMPORAL:
        if not s.temporal_address:
            problems.append("TEMPORAL_ADDRESS is not set")
        elif problem := temporal_problem(s.temporal_address, wait_s):
            problems.append(problem)
    return problems
