"""What every job activity reports about itself, whatever it does: its stage's duration (metric),
the job it works on (log context, span attributes) and the error code it failed with (span
attribute).

The job is read from the activity's workflow id, `{queueName}:{jobType}:{jobId}`: ids only,
nothing the job carries. Installed on the job workers after the client's tracing interceptor
(so the current span is `RunActivity:<name>`) and before `PublicFailureInterceptor` (so an
unexpected exception is seen as the public code it becomes).
"""

from __future__ import annotations

import functools
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from opentelemetry import trace
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities.metrics import STAGE_OF_ACTIVITY, WorkerMetrics, error_code_label, worker_metrics
from engine.errors import is_retryable
from engine.logcontext import bind_job, unbind
from providers.base import ProviderResponse

# Span attribute names (one prefix, so a collector can drop or keep them together).
JOB_ID = "aijobs.job_id"
JOB_TYPE = "aijobs.job_type"
ATTEMPT = "aijobs.attempt"
ERROR_CODE = "aijobs.error_code"


def job_of(workflow_id: str | None, workflow_type: str | None) -> tuple[str, str] | None:
    """(job id, job type) of a job workflow's id, or None for any other workflow."""
    if not workflow_id or not workflow_type:
        return None
    return _job_of(workflow_id, workflow_type)


@functools.lru_cache(maxsize=4096)  # a job's five stages ask with the same workflow id
def _job_of(workflow_id: str, workflow_type: str) -> tuple[str, str] | None:
    parts = workflow_id.rsplit(":", 2)
    if len(parts) != 3 or parts[1] != workflow_type:
        return None
    try:
        return str(uuid.UUID(parts[2])), parts[1]
    except ValueError:
        return None


class _Inbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, metrics: WorkerMetrics) -> None:
        super().__init__(next)
        self._metrics = metrics

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        stage = STAGE_OF_ACTIVITY.get(info.activity_type)
        job = job_of(info.workflow_id, info.workflow_type)
        span = trace.get_current_span()
        recording = span.is_recording()
        token = None
        if job is not None:
            token = bind_job(job[0], job[1], info.workflow_id)
            if recording:
                span.set_attributes({JOB_ID: job[0], JOB_TYPE: job[1], ATTEMPT: info.attempt})
        started = time.monotonic()
        try:
            return await self.next.execute_activity(input)
        except ApplicationError as exc:
            if recording:
                span.set_attribute(ERROR_CODE, error_code_label(exc.type) or "OTHER")
            raise
        finally:
            if stage is not None:
                self._metrics.stage(stage, time.monotonic() - started)
            if token is not None:
                unbind(token)


class JobTelemetryInterceptor(Interceptor):
    def __init__(self, metrics: WorkerMetrics | None = None) -> None:
        self._metrics = metrics or worker_metrics()

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next, self._metrics)


def seconds_since(ts: datetime) -> float:
    """Wall-clock seconds from a database timestamp to now (never negative: clocks drift)."""
    return max(0.0, (datetime.now(UTC) - ts).total_seconds())


def retry_follows(code: str, *, attempt: int, abort_strategy: str) -> bool:
    """Whether Temporal will run another attempt of this activity after it fails with `code`:
    the taxonomy allows it and the retry policy has attempts left."""
    if not is_retryable(code, attempt=attempt, abort_strategy=abort_strategy):
        return False
    policy = activity.info().retry_policy
    if policy is None:
        return True
    if code in (policy.non_retryable_error_types or ()):
        return False
    return policy.maximum_attempts == 0 or attempt < policy.maximum_attempts


def observe_call(
    metrics: WorkerMetrics,
    provider: str,
    model: str,
    latency_s: float,
    *,
    error_code: str | None,
    response: ProviderResponse | None,
    cost_usd: Decimal = Decimal(0),
) -> None:
    """One provider call: its outcome, latency, tokens and cost (the caller prices it once,
    with the same table as its ai_usage_log row). `model` is the configured model (a bounded
    label), not whatever the provider echoes. A call with no answer read is still counted at
    its charge (an estimate: the money was spent all the same)."""
    if response is None:
        metrics.provider_call(provider, model, latency_s, error_code=error_code, cost_usd=cost_usd)
        return
    metrics.provider_call(
        provider,
        model,
        latency_s,
        error_code=error_code,
        tokens_in=response.tokens_in,
        tokens_out=response.tokens_out,
        cost_usd=cost_usd,
    )
