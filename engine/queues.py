"""The job queues' configuration, in one place: the specification's queue table.

| queue            | concurrency | lock | attempts | backoff             |
|------------------|-------------|------|----------|---------------------|
| `ai-interactive` | 2           | 30 s | 2        | exponential 2000 ms |
| `ai-background`  | 1           | 60 s | 3        | exponential 5000 ms |

A job type inherits its queue's attempts, backoff and lock unless its definition overrides them
(`Execution.max_retries`, `retry_backoff`, `lock_ms`); `resolve_execution` is the one function
that combines the two, used by PREPARE's plan, by the create path (`max_retry_count`) and by
EXECUTE's lock. The worker's provider-call concurrency per queue comes from here too
(AI_INTERACTIVE_CONCURRENCY / AI_BACKGROUND_CONCURRENCY override it).

What "lock" maps to (BullMQ's lockDuration: how long a silent worker keeps a job before it is
considered stalled): EXECUTE's Temporal heartbeat timeout (a worker silent that long loses the
attempt, which is retried elsewhere). The SQL lock TTL (`ai_job.lock_until`, extended every half
of it while the call runs) is the specification's `lockJob` TTL instead, `LOCK_TTL_S` (60 s) on
every queue: the 30 s lockDuration of `ai-interactive` is a stall detector, which the heartbeat
timeout is, while the row's lock only tells the reconciler when an abandoned job may be failed
(TTL + the reconciler's LOCK_GRACE_S = the specification's 90 s). A longer TTL never delays a
retry: a new attempt of the same workflow takes the lock over whatever `lock_until` says.
AI_HEARTBEAT_TIMEOUT_MS, when set, overrides the heartbeat timeout for every queue (a type's own
`lock_ms` still wins, for both). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.definition import JobDefinition


# The specification's `lockJob` TTL (`lockUntil = now + 60 s`, extended every 30 s): the SQL lock
# of a running job on every queue, unless the type's own `lock_ms` says otherwise.
LOCK_TTL_S = 60


@dataclass(frozen=True)
class QueueConfig:
    name: str
    concurrency: int  # provider calls at once per worker process
    lock_ms: int  # lockDuration: the heartbeat timeout of a running EXECUTE
    attempts: int  # provider attempts per job, the first included
    backoff_ms: int  # before the first retry; doubles after each


QUEUES: dict[str, QueueConfig] = {
    "ai-interactive": QueueConfig(
        "ai-interactive", concurrency=2, lock_ms=30_000, attempts=2, backoff_ms=2000
    ),
    "ai-background": QueueConfig(
        "ai-background", concurrency=1, lock_ms=60_000, attempts=3, backoff_ms=5000
    ),
}


def queue_config(queue_name: str) -> QueueConfig:
    """Raises KeyError for a name that is not a job queue (registration refuses those)."""
    return QUEUES[queue_name]


@dataclass(frozen=True)
class ResolvedExecution:
    """A job type's effective retry and lock policy."""

    max_attempts: int
    backoff_ms: int
    heartbeat_timeout_ms: int
    lock_ttl_s: int

    @property
    def max_retries(self) -> int:
        return self.max_attempts - 1

    @property
    def lock_extend_every_s(self) -> float:
        return self.lock_ttl_s / 2


def resolve_execution(
    d: JobDefinition,
    *,
    heartbeat_timeout_ms: int | None = None,
    lock_ttl_s: int | None = None,
) -> ResolvedExecution:
    """The definition's own values where it sets them, else the queue's (the SQL lock TTL:
    `LOCK_TTL_S`). The keyword arguments are overrides (AI_HEARTBEAT_TIMEOUT_MS; a test's
    shorter lock); a definition's `lock_ms` wins over them, being the type author's explicit
    choice."""
    q = queue_config(d.queue.queue_name)
    e = d.execution
    own_lock = e.lock_ms
    return ResolvedExecution(
        max_attempts=(e.max_retries + 1) if e.max_retries is not None else q.attempts,
        backoff_ms=e.retry_backoff.delay if e.retry_backoff is not None else q.backoff_ms,
        heartbeat_timeout_ms=own_lock or heartbeat_timeout_ms or q.lock_ms,
        lock_ttl_s=max(1, -(-own_lock // 1000)) if own_lock else lock_ttl_s or LOCK_TTL_S,
    )
