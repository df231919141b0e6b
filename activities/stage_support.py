"""What the job stages share: their configuration, their dependencies, and how an attempt fails.

Failure rules (the error taxonomy): an attempt that may be retried raises
`ApplicationError(type=CODE, non_retryable=False)` and Temporal's retry policy decides; a final
failure (nothing a retry could change) raises it non-retryable. The message is always the code's
public message; details for operators go to `ai_job.internal_error_message`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import NoReturn, TypeVar

from pydantic import BaseModel, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.gateway import Gateway
from activities.metrics import WorkerMetrics, worker_metrics
from db.errors import is_unavailable
from db.jobs import JobQueries, JobRow
from db.lifecycle import LifecycleRepository
from db.outbox import COMPLETED, OutboxRepository
from db.provider_gate import ProviderGate
from db.session import SessionMaker
from db.usage import UsageRepository
from engine.contracts import ProjectResult
from engine.definition import JobDefinition
from engine.errors import EngineError, is_retryable, public_message_for
from engine.queues import ResolvedExecution, resolve_execution
from jobs.spec import Catalog, ProjectionContext

log = logging.getLogger("activities.stages")
T = TypeVar("T")


@dataclass(frozen=True)
class EngineConfig:
    # Operators' overrides of the queues' lock (AI_LOCK_TTL_S, AI_HEARTBEAT_TIMEOUT_MS); None:
    # each job type's own value, else its queue's (engine/queues.py, `StageDeps._execution_policy`).
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
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    @property
    def execute_margin_ms(self) -> int:
        return int((2 * self.db_retry_budget_s + 15) * 1000)


class StageDeps:
    """Built once per worker with its session factory, catalog and gateway."""

    def __init__(
        self,
        sessionmaker: SessionMaker,
        catalog: Catalog,
        gateway: Gateway,
        config: EngineConfig | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._sm = sessionmaker
        self._catalog = catalog
        self._gateway = gateway
        self._config = config or EngineConfig()
        self._metrics = metrics or worker_metrics()

        self._lifecycle = LifecycleRepository()
        self._jobs = JobQueries()
        self._outbox = OutboxRepository()
        self._usage = UsageRepository()
        self._gate = ProviderGate()

    def _execution_policy(self, d: JobDefinition) -> ResolvedExecution:
        """The job type's attempts, backoff and lock: its own, the operator's override of the
        lock, else its queue's. The one place the stages read them."""
        cfg = self._config
        return resolve_execution(
            d, heartbeat_timeout_ms=cfg.heartbeat_timeout_ms, lock_ttl_s=cfg.lock_ttl_s
        )

    def _lock_policy(self, job_type: str) -> tuple[int, float]:
        """The SQL lock TTL of a job of `job_type` and how often EXECUTE extends it."""
        policy = self._execution_policy(self._catalog.get(job_type).definition)
        every = self._config.lock_extend_every_s or policy.lock_extend_every_s
        return policy.lock_ttl_s, every

    async def _project_in(
        self, s: AsyncSession, row: JobRow, out: BaseModel, digest: str, owner: str
    ) -> ProjectResult:
        """Projector + artifacts + markSucceeded + `ai.job.completed` + the usage summary, in the
        caller's transaction. Idempotent through unique keys (a repeated projection of the same
        output writes nothing new); raises what the projector raises."""
        jt = self._catalog.get(row.job_type)
        ctx = ProjectionContext(
            job_id=row.id,
            user_id=row.user_id,
            target_type=row.target_type,
            target_id=row.target_id,
            output_hash=digest,
        )
        artifacts = await jt.project(s, ctx, out)
        for a in artifacts:
            await self._jobs.insert_artifact(s, row.id, a.artifact_type, a.artifact_id, a.ordinal)
        await self._lifecycle.mark_succeeded(s, row.id, owner=owner)
        await self._outbox.insert(
            s,
            event_type=COMPLETED,
            aggregate_type="AiJob",
            aggregate_id=str(row.id),
            dedupe_key=f"{COMPLETED}:{row.id}",
            payload={
                "jobId": str(row.id),
                "jobType": row.job_type,
                "outputHash": digest,
                "artifactCount": len(artifacts),
            },
            notify=False,
        )
        usage = await self._usage.summary(s, row.id)
        return ProjectResult(
            "succeeded",
            len(artifacts),
            calls=usage.calls,
            tokens_in=usage.tokens_in,
            tokens_out=usage.tokens_out,
            cost_micros=int(usage.cost_usd * 1_000_000),
        )


def log_completed(job_id: str, result: ProjectResult) -> None:
    """The job's one "completed" line, after the commit that made it so."""
    log.info(
        "job completed",
        extra={
            "job_id": job_id,
            "calls": result.calls,
            "tokens_in": result.tokens_in,
            "tokens_out": result.tokens_out,
            "cost_micros": result.cost_micros,
        },
    )


def fail_attempt(
    code: str,
    *,
    attempt: int,
    abort_strategy: str = "retry",
    retry_after_s: float | None = None,
) -> NoReturn:
    """This attempt failed with `code`; the taxonomy says whether another may follow."""
    raise ApplicationError(
        public_message_for(code),
        type=code,
        non_retryable=not is_retryable(code, attempt=attempt, abort_strategy=abort_strategy),
        next_retry_delay=timedelta(seconds=retry_after_s) if retry_after_s else None,
    )


def fail_final(code: str) -> NoReturn:
    """A failure no retry can change (a missing job, a lost lock, a cancel)."""
    raise ApplicationError(public_message_for(code), type=code, non_retryable=True)


def fail_domain(exc: EngineError) -> NoReturn:
    """A domain error in a bookkeeping stage is final: retrying cannot change the answer."""
    raise ApplicationError(exc.public_message, type=exc.code, non_retryable=True) from None


def summarise_validation(exc: ValidationError) -> str:
    """What was wrong with an output, without the output itself (pydantic's messages)."""
    parts = []
    for e in exc.errors(include_url=False, include_input=False)[:10]:
        loc = ".".join(str(p) for p in e.get("loc", ())) or "(root)"
        parts.append(f"{loc}: {e.get('msg', '')}")
    return "; ".join(parts)


def lock_owner() -> str:
    """The lock owner of the job this activity works on: its workflow id, one per job and the
    same across runs (a Temporal Reset keeps the lock)."""
    workflow_id = activity.info().workflow_id
    if not workflow_id:
        raise RuntimeError("a job stage runs only inside its job's workflow")
    return workflow_id


async def db_retry(op: Callable[[], Awaitable[T]], *, budget_s: float) -> T:
    """EXECUTE's own transactions ride out a database outage (heartbeating meanwhile) instead of
    failing the attempt: a lost connection must not spend one of the job's provider attempts."""
    delay = 0.5
    deadline = time.monotonic() + budget_s
    while True:
        try:
            return await op()
        except Exception as exc:
            if not is_unavailable(exc) or time.monotonic() > deadline:
                raise
            log.warning("database unavailable in EXECUTE; retrying in %.1fs", delay)
            activity.heartbeat()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 4.0)
