"""Each process's `application_name` (runtime/names.py), as docs/operations.md lists them: a
worker serving one task queue is named for it, several (or all) is `aijobs-worker`; the other
long-running roles have their own name; every other command is `aijobs-cli`."""

from __future__ import annotations

import pytest

from runtime.names import application_name
from runtime.worker import ALL_QUEUES


@pytest.mark.parametrize(
    ("role", "queues", "name"),
    [
        ("api", (), "aijobs-api"),
        ("worker", ("ai-interactive",), "aijobs-worker-ai-interactive"),
        ("worker", ("ai-background",), "aijobs-worker-ai-background"),
        ("worker", ("ai-system",), "aijobs-worker-ai-system"),
        ("worker", ("ai-interactive", "ai-system"), "aijobs-worker"),
        ("worker", ALL_QUEUES, "aijobs-worker"),
        ("worker", (), "aijobs-worker"),
        ("relay", (), "aijobs-relay"),
        ("reconcile", (), "aijobs-reconcile"),
        ("migrate", (), "aijobs-migrate"),
        ("outbox-dead", (), "aijobs-cli"),
        ("rotate-keys", (), "aijobs-cli"),
        ("token", (), "aijobs-cli"),
    ],
)
def test_each_process_has_its_name(role: str, queues: tuple[str, ...], name: str) -> None:
    assert application_name(role, queues) == name
    assert len(f"{name}-listener") < 64  # PostgreSQL keeps NAMEDATALEN - 1 bytes
