"""The queue table of the specification and how a job type's execution values resolve from it
(a type's own value, then the operator's, then its queue's); the stack-level checks of the same
rules are tests/integration/test_queue_defaults.py."""

from __future__ import annotations

import pytest

from engine.definition import Execution, JobDefinition, QueueSpec, RetryBackoff
from engine.queues import QUEUES, resolve_execution
from jobs.types import default_catalog


def test_the_specifications_queue_table() -> None:
    table = {q.name: (q.concurrency, q.lock_ms, q.attempts, q.backoff_ms) for q in QUEUES.values()}
    assert table == {
        "ai-interactive": (2, 30_000, 2, 2000),
        "ai-background": (1, 60_000, 3, 5000),
    }


@pytest.mark.parametrize(
    ("queue", "attempts", "backoff_ms", "heartbeat_ms", "lock_s"),
    [("ai-interactive", 2, 2000, 30_000, 60), ("ai-background", 3, 5000, 60_000, 60)],
)
def test_a_type_without_overrides_inherits_its_queues_values(
    queue: str, attempts: int, backoff_ms: int, heartbeat_ms: int, lock_s: int
) -> None:
    d = JobDefinition(job_type="plain_type", queue=QueueSpec(queue_name=queue))
    policy = resolve_execution(d)
    assert (policy.max_attempts, policy.backoff_ms) == (attempts, backoff_ms)
    assert (policy.heartbeat_timeout_ms, policy.lock_ttl_s) == (heartbeat_ms, lock_s)
    assert d.max_attempts == attempts


def test_a_types_own_values_win_then_the_operators_then_the_queues() -> None:
    own = JobDefinition(
        job_type="own_values",
        queue=QueueSpec(queue_name="ai-background"),
        execution=Execution(max_retries=0, retry_backoff=RetryBackoff(delay=700), lock_ms=9000),
    )
    policy = resolve_execution(own, heartbeat_timeout_ms=2000, lock_ttl_s=5)
    assert (policy.max_attempts, policy.backoff_ms) == (1, 700)
    assert (policy.heartbeat_timeout_ms, policy.lock_ttl_s) == (9000, 9)

    inherited = JobDefinition(job_type="inherits", queue=QueueSpec(queue_name="ai-background"))
    overridden = resolve_execution(inherited, heartbeat_timeout_ms=2000, lock_ttl_s=5)
    assert (overridden.heartbeat_timeout_ms, overridden.lock_ttl_s) == (2000, 5)
    assert (overridden.max_attempts, overridden.backoff_ms) == (3, 5000)  # not the lock's


def test_the_built_in_types_keep_their_attempts_and_backoff() -> None:
    expected = {
        "quiz_generation": (2, 2000),
        "flashcard_generation": (2, 2000),
        "synthetic": (2, 2000),
        "weak_point_analysis": (3, 5000),
    }
    catalog = default_catalog()
    got = {}
    for name in expected:
        policy = resolve_execution(catalog.get(name).definition)
        got[name] = (policy.max_attempts, policy.backoff_ms)
    assert got == expected
