"""What every job stage is built from: one frozen `StageDeps` per worker, passed to each stage
object (`activities/prepare.py`, `resolve.py`, `execute.py`, `project.py`, `complete.py`,
`finalize.py`). The stages share these and nothing else: no base class, no state of their own
beyond what they are given, so each can be built and run alone (tests build one stage).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from temporalio import activity

from activities.metrics import WorkerMetrics, worker_metrics
from activities.stage_handoff import Handoff
from db.batches import BatchCaps
from db.provider_limits import LimitTable
from db.session import SessionMaker
from engine.definition import JobDefinition
from engine.queues import ResolvedExecution, resolve_execution
from jobs.costs import ESTIMATE_MARGIN
from jobs.gateway import Gateway
from jobs.spec import Catalog

# Every stage logs under this one name (the log lines of a job's stages read together, and
# docs/observability.md's examples name it).
log = logging.getLogger("activities.stages")
# The engine's one sender of workflow signals (runtime/signals.py `signal_all`: client, workflow
# ids, signal name, `strict=`; how many were delivered), handed to the activities that signal by
# the worker that builds them (activities may not import runtime/).
SignalAll = Callable[..., Awaitable[int]]


@dataclass(frozen=True)
class EngineConfig:
    # Overrides of the queues' lock (AI_HEARTBEAT_TIMEOUT_MS; the SQL lock TTL only in tests);
    # None: each job type's own value, else its queue's (engine/queues.py,
    # `StageDeps.execution_policy`).
    lock_ttl_s: int | None = None
    heartbeat_timeout_ms: int | None = None
    # How often EXECUTE extends lock_until in SQL. None: every half of the job's lock TTL.
    lock_extend_every_s: float | None = None
    # How long EXECUTE's own transactions wait out a database outage before the attempt fails.
    # EXECUTE's start-to-close timeout is the job's timeout plus twice this plus a margin, so a
    # database blip after the provider answered never turns into TIMEOUT or a second call.
    db_retry_budget_s: float = 60.0
    # A provider's Retry-After is honoured up to this many seconds.
    retry_after_max_s: float = 300.0
    # The circuit breaker: this many consecutive failed calls open it for `cooldown` seconds.
    breaker_failures: int = 5
    breaker_cooldown_s: float = 30.0
    # AI_MODEL_LIMITS: requests and tokens per minute and calls at once per (provider, model,
    # key), enforced in EXECUTE's first transaction (db/provider_limits.py).
    model_limits: LimitTable = field(default_factory=LimitTable)
    # The user cost budgets (QUOTA_MAX_COST_USD_PER_DAY/_MONTH; 0: none) and the estimate's
    # margin (jobs/costs.py): a call after a paid one is reserved against them first.
    budget_per_day_usd: float = 0.0
    budget_per_month_usd: float = 0.0
    estimate_margin: float = ESTIMATE_MARGIN
    # AI_CHUNK_CONCURRENCY: a long source's chunk calls one job keeps in flight at once. RESOLVE
    # reports it, so the window is part of the run's history and replays the same.
    chunk_concurrency: int = 4
    # AI_BATCH_MAX_LINES, AI_BATCH_MAX_BYTES: what one batch's file may hold (db/batches.py).
    batch_caps: BatchCaps = field(default_factory=BatchCaps)
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    @property
    def execute_margin_ms(self) -> int:
        return int((2 * self.db_retry_budget_s + 15) * 1000)


@dataclass(frozen=True)
class StageDeps:
    """Built once per worker (runtime/worker.py). The stages call the `db/` modules' functions
    directly, in the session the stage opened; the stage owns the transaction."""

    sessionmaker: SessionMaker
    catalog: Catalog
    gateway: Gateway
    config: EngineConfig = field(default_factory=EngineConfig)
    metrics: WorkerMetrics = field(default_factory=worker_metrics)
    # The worker's signal sender; None: this stage object sends no signal (a test's).
    signal_all: SignalAll | None = None
    # PREPARE's reads for RESOLVE, within this worker process (activities/stage_handoff.py).
    handoff: Handoff = field(default_factory=Handoff)

    def execution_policy(self, d: JobDefinition) -> ResolvedExecution:
        """The job type's attempts, backoff and lock: its own, the operator's override of the
        lock, else its queue's. The one place the stages read them."""
        cfg = self.config
        return resolve_execution(
            d, heartbeat_timeout_ms=cfg.heartbeat_timeout_ms, lock_ttl_s=cfg.lock_ttl_s
        )

    def lock_policy(self, job_type: str) -> tuple[int, float]:
        """The SQL lock TTL of a job of `job_type` and how often EXECUTE extends it."""
        policy = self.execution_policy(self.catalog.get(job_type).definition)
        every = self.config.lock_extend_every_s or policy.lock_extend_every_s
        return policy.lock_ttl_s, every


def lock_owner() -> str:
    """The lock owner of the job this activity works on: its workflow id, one per job and the
    same across runs (a Temporal Reset, a continue-as-new keep the lock). The owner part of
    `db/lifecycle.py` `owner_token`, compared by `lock_holder`."""
    workflow_id = activity.info().workflow_id
    if not workflow_id:
        raise RuntimeError("a job stage runs only inside its job's workflow")
    return workflow_id
