"""What each process tells PostgreSQL it is (`application_name`, sent as a connection parameter
when a connection opens), so that `pg_stat_activity` names the process behind every backend
(docs/operations.md "Connections"). Its listener's connection adds `-listener` (db/listener.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from db.session import DEFAULT_APPLICATION_NAME

# The roles whose connections carry a name of their own; any other command is `aijobs-cli`.
_NAMED = ("api", "relay", "reconcile", "migrate")


def application_name(role: str, queues: Sequence[str] = ()) -> str:
    """`aijobs-api`, `aijobs-relay`, `aijobs-reconcile`, `aijobs-migrate`; a worker serving one
    task queue `aijobs-worker-<queue>` (`aijobs-worker-ai-interactive`), several (or all)
    `aijobs-worker`; any other command `aijobs-cli`."""
    if role == "worker":
        return f"aijobs-worker-{queues[0]}" if len(queues) == 1 else "aijobs-worker"
    if role in _NAMED:
        return f"aijobs-{role}"
    return DEFAULT_APPLICATION_NAME
