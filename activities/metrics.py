"""The worker's Prometheus metrics: every family a worker process exports, defined here once.

Conventions: counters end in `_total`, durations are `_seconds` histograms, money is USD, and
label values come from small fixed sets (job types of the catalog, lifecycle states, error codes
of the taxonomy, provider and model names from configuration, stage and action names). A job id,
a user id or anything a job carries is never a label value: one series per job would grow
without bound and would publish ids to whoever can scrape.

Recording is cheap on the hot path: label children are looked up once and cached, nothing here
touches the database, and with no scraper attached the cost is a few additions per job.

The families live in one `WorkerMetrics` object on a registry: the process-wide default one
(`worker_metrics()`, what `aijobs worker` serves) or one a test injects.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from activities.metrics_fallback import FallbackMetrics
from activities.metrics_money import MoneyMetrics
from engine.errors import PUBLIC_MESSAGES
from jobs.flow_metrics import FlowMetrics

# Every code the engine raises itself; anything else (a synthetic job's scripted `failCode`, a
# provider's new code) is reported under its family, so a client cannot mint label values.
KNOWN_CODES: frozenset[str] = frozenset(PUBLIC_MESSAGES) | {
    "CREDENTIAL_NOT_FOUND",
    "INTERNAL_JOB_MISSING",
    "INTERNAL_LOCK_CONFLICT",
    "INTERNAL_NOT_LOCK_OWNER",
    "INTERNAL_OUTPUT_MISMATCH",
    "INTERNAL_PROJECTION_FAILED",
    "INTERNAL_SNAPSHOT_MISSING",
    "INTERNAL_WORKER_LOST",
    "INTERNAL_WORKER_SHUTDOWN",
    "INTERNAL_ILLEGAL_TRANSITION",
    "VALIDATION_FAILED",
}
_FAMILIES = (
    "PROVIDER_",
    "VALIDATION_",
    "CONTENT_SAFETY_",
    "CREDENTIAL_",
    "REQUEST_",
    "INTERNAL_",
)

# Activity names (engine.contracts) → the stage they time: the five stages and the finalizers.
STAGE_OF_ACTIVITY: dict[str, str] = {
    "prepare": "prepare",
    "resolve": "resolve",
    "execute": "execute",
    "project": "project",
    "complete": "complete",
    "finalize_failed": "finalize",
    "finalize_cancelled": "finalize",
}
STAGES = ("prepare", "resolve", "execute", "project", "complete", "finalize")
RECONCILER_ACTIONS = (
    "expired_lock_failed",
    "outbox_requeued",
    "snapshot_deleted",
    "cancel_resent",
    "stuck_workflow",
    "enqueue_revived",
    "enqueue_closed",
    "private_data_purged",
    "outbox_deleted",
    "finalizer_ended",
)
# Distinct model names `aijobs_unpriced_calls_total` labels before it says `other`.
UNPRICED_MODEL_LABELS = 10
RELAY_OUTCOMES = ("started", "acknowledged", "retry", "unavailable", "malformed")
WEBHOOK_OUTCOMES = ("delivered", "failed", "dead")
# Why a job waited before its provider call (db/provider_limits.py, db/provider_gate.py).
LIMITER_REASONS = ("rpm", "tpm", "concurrency", "announced", "pause", "breaker", "operator_pause")

_FAST = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_STAGE_BUCKETS = (*_FAST, 120.0, 300.0, 600.0)
_WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                 1800.0, 3600.0)  # fmt: skip
_CALL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_LAG_BUCKETS = (*_FAST, 300.0)


def error_code_label(code: str | None) -> str:
    """The label value for an error code: the code itself when the engine knows it, else its
    family (`PROVIDER_OTHER`, ...), else `OTHER`. Empty for "no error"."""
    if not code:
        return ""
    if code in KNOWN_CODES:
        return code
    for family in _FAMILIES:
        if code.startswith(family):
            return f"{family}OTHER"
    return "OTHER"


def _label(value: str, limit: int = 64) -> str:
    return value[:limit] if value else "unknown"


# Reported / estimated input tokens: tight around 1, with tails wide enough to catch a
# vocabulary that counts twice or half as many.
_ESTIMATE_BUCKETS = (0.5, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0)


class WorkerMetrics:
    """The worker-side families. One instance per registry: the default registry's is
    `worker_metrics()`."""

    jobs_finished: Counter
    stage_duration: Histogram
    queue_wait: Histogram
    provider_calls: Counter
    provider_latency: Histogram
    tokens_in: Counter
    tokens_out: Counter
    cost: Counter
    unpriced_calls: Counter
    limiter_waits: Counter
    limiter_wait: Histogram
    estimate_ratio: Histogram
    execute_retries: Counter
    reconciler_actions: Counter
    stuck_workflows: Gauge
    reconciler_phase_failures: Counter
    reconciler_temporal_calls: Counter
    reconciler_last_pass: Gauge
    relay_lag: Histogram
    relay_dispatch: Counter
    webhook_deliveries: Counter
    poller_restarts: Counter
    _unpriced_models: set[str]

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else REGISTRY
        # Registered in this order, which is the order a scrape lists them in.
        self._job_families(reg)
        self._provider_families(reg)
        self._reconciler_families(reg)
        self._relay_families(reg)
        self.money = MoneyMetrics(reg)  # what calls are charged (activities/metrics_money.py)
        self.fallbacks = FallbackMetrics(reg)  # calls moved down the fallback chain
        self.flow = FlowMetrics(reg)  # jobs flow control ended or held (jobs/flow_metrics.py)
        self._children: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()
        for outcome in WEBHOOK_OUTCOMES:
            self._child(self.webhook_deliveries, outcome)
        for stage in STAGES:
            self._child(self.stage_duration, stage)
        for action in RECONCILER_ACTIONS:
            self._child(self.reconciler_actions, action)

    def _job_families(self, reg: CollectorRegistry) -> None:
        """Jobs that ended, stage run times, and the wait for a worker slot."""
        self.jobs_finished = Counter(
            "aijobs_jobs_finished_total",
            "Jobs that reached a terminal state in this process, where they ended (EXECUTE's "
            "in-slot projection, PROJECT, the finalizers, the reconciler).",
            ["job_type", "status", "error_code"],
            registry=reg,
        )
        self.stage_duration = Histogram(
            "aijobs_stage_duration_seconds",
            "Run time of one stage activity (prepare, execute, project, finalize), per attempt.",
            ["stage"],
            buckets=_STAGE_BUCKETS,
            registry=reg,
        )
        self.queue_wait = Histogram(
            "aijobs_queue_wait_seconds",
            "From the job's creation to the start of its first EXECUTE (a worker slot took it).",
            ["job_type", "queue"],
            buckets=_WAIT_BUCKETS,
            registry=reg,
        )

    def _provider_families(self, reg: CollectorRegistry) -> None:
        """Provider calls: outcomes, latency, tokens, money, the limiter's holds, the estimate's
        accuracy and EXECUTE's retries."""
        self.provider_calls = Counter(
            "aijobs_provider_calls_total",
            "Provider calls made by EXECUTE, by outcome (error_code empty: answered).",
            ["provider", "model", "error_code"],
            registry=reg,
        )
        self.provider_latency = Histogram(
            "aijobs_provider_call_duration_seconds",
            "Duration of one provider call, answered or not.",
            ["provider", "model"],
            buckets=_CALL_BUCKETS,
            registry=reg,
        )
        self.tokens_in = Counter(
            "aijobs_provider_input_tokens_total",
            "Prompt tokens the provider reported.",
            ["provider", "model"],
            registry=reg,
        )
        self.tokens_out = Counter(
            "aijobs_provider_output_tokens_total",
            "Completion tokens the provider reported.",
            ["provider", "model"],
            registry=reg,
        )
        self.cost = Counter(
            "aijobs_provider_cost_usd_total",
            "Cost of provider calls in USD (the same pricing as ai_usage_log).",
            ["provider", "model"],
            registry=reg,
        )
        self.unpriced_calls = Counter(
            "aijobs_unpriced_calls_total",
            "Provider calls whose model the price table does not know, charged the fallback "
            "price (AI_MODEL_FALLBACK_PRICE); past a few distinct models, `other`.",
            ["model"],
            registry=reg,
        )
        self._unpriced_models = set()
        self.limiter_waits = Counter(
            "aijobs_limiter_waits_total",
            "Times EXECUTE held a job back before its provider call, by why: a limit of "
            "AI_MODEL_LIMITS (rpm, tpm, concurrency), a limit or exhaustion the provider announced "
            "in its rate-limit headers (announced), a 429's pause or an open breaker.",
            ["provider", "model", "reason"],
            registry=reg,
        )
        self.limiter_wait = Histogram(
            "aijobs_limiter_wait_seconds",
            "How long EXECUTE asked a held-back job to wait before it asks again.",
            ["reason"],
            buckets=_WAIT_BUCKETS,
            registry=reg,
        )
        self.estimate_ratio = Histogram(
            "aijobs_token_estimate_ratio",
            "A call's provider-reported input tokens divided by the job's estimate at create "
            "(1 = exact; above 1.25, the estimate margin, a worst case undercounted).",
            ["job_type", "model"],
            buckets=_ESTIMATE_BUCKETS,
            registry=reg,
        )
        self.execute_retries = Counter(
            "aijobs_execute_retries_total",
            "EXECUTE attempts that failed and will be retried, by the code that failed them "
            "(each is one EXECUTE attempt beyond the first).",
            ["job_type", "error_code"],
            registry=reg,
        )

    def _reconciler_families(self, reg: CollectorRegistry) -> None:
        """What reconciler passes repaired, what they saw stuck, what failed and what they cost."""
        self.reconciler_actions = Counter(
            "aijobs_reconciler_actions_total",
            "What the reconciler repaired or cleaned, per action.",
            ["action"],
            registry=reg,
        )
        self.stuck_workflows = Gauge(
            "aijobs_stuck_workflows",
            "Workflows whose workflow task keeps failing, seen by the last reconciler pass "
            "(log alert AIJOBS_STUCK_WORKFLOW).",
            registry=reg,
        )
        self.reconciler_phase_failures = Counter(
            "aijobs_reconciler_phase_failures_total",
            "Reconciler phases that raised or overran their time budget (the pass ran the "
            "other phases), per phase.",
            ["phase"],
            registry=reg,
        )
        self.reconciler_temporal_calls = Counter(
            "aijobs_reconciler_temporal_calls_total",
            "Temporal RPCs made by reconciler passes (describes, visibility pages, cancels, "
            "starts); bounded per pass whatever the backlog.",
            registry=reg,
        )
        self.reconciler_last_pass = Gauge(
            "aijobs_reconciler_last_pass_timestamp_seconds",
            "Unix time at which the last reconciler pass of this process ended.",
            registry=reg,
        )

    def _relay_families(self, reg: CollectorRegistry) -> None:
        """The outbox relay, webhook deliveries and the supervised pollers."""
        self.relay_lag = Histogram(
            "aijobs_relay_lag_seconds",
            "From the outbox row's creation to its workflow being started by the relay.",
            ["queue"],
            buckets=_LAG_BUCKETS,
            registry=reg,
        )
        self.relay_dispatch = Counter(
            "aijobs_relay_dispatch_total",
            "Outbox rows dispatched by the relay, by event type and outcome (started, "
            "acknowledged, retry, unavailable, malformed).",
            ["event_type", "status"],
            registry=reg,
        )
        self.webhook_deliveries = Counter(
            "aijobs_webhook_deliveries_total",
            "Webhook delivery attempts by outcome: delivered (2xx), failed (to be retried), "
            "dead (retries used up, endpoint or job gone). No URL, user or secret is a label.",
            ["status"],
            registry=reg,
        )
        self.poller_restarts = Counter(
            "aijobs_poller_restarts_total",
            "Times a supervised poller loop (relay, webhooks) failed or ended early and was "
            "started again by its process (runtime/supervisor.py).",
            ["poller"],
            registry=reg,
        )

    def _child(self, family: Any, *labels: str) -> Any:
        """The label child, cached: `labels()` takes a lock and builds a key on every call."""
        key = (id(family), *labels)
        child = self._children.get(key)
        if child is None:
            with self._lock:
                child = self._children.get(key)
                if child is None:
                    child = family.labels(*labels)
                    self._children[key] = child
        return child

    def prepare(self, job_types: Iterable[str], queues: Iterable[str] = ()) -> None:
        """Create the series every dashboard expects at zero (a rate over a series that does not
        exist yet is empty, not 0)."""
        queues = tuple(queues)
        for jt in job_types:
            self._child(self.jobs_finished, _label(jt), "succeeded", "")
            for q in queues:
                self._child(self.queue_wait, _label(jt), q)

    # ---- recording ---------------------------------------------------------------------------

    def job_finished(self, job_type: str, status: str, error_code: str | None = None) -> None:
        code = error_code_label(error_code)
        self._child(self.jobs_finished, _label(job_type), status, code).inc()

    def stage(self, stage: str, seconds: float) -> None:
        self._child(self.stage_duration, stage).observe(seconds)

    def waited(self, job_type: str, queue: str, seconds: float) -> None:
        self._child(self.queue_wait, _label(job_type), _label(queue)).observe(max(0.0, seconds))

    def provider_call(
        self,
        provider: str,
        model: str,
        seconds: float,
        *,
        error_code: str | None = None,
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost_usd: Decimal | float = 0,
    ) -> None:
        p, m = _label(provider), _label(model)
        self._child(self.provider_calls, p, m, error_code_label(error_code)).inc()
        self._child(self.provider_latency, p, m).observe(seconds)
        if tokens_in:
            self._child(self.tokens_in, p, m).inc(tokens_in)
        if tokens_out:
            self._child(self.tokens_out, p, m).inc(tokens_out)
        if cost_usd:
            self._child(self.cost, p, m).inc(float(cost_usd))

    def unpriced_call(self, model: str) -> None:
        """One call charged the fallback price. The model is the provider's echo, so the label
        is bounded: the first UNPRICED_MODEL_LABELS distinct names, then `other`."""
        label = _label(model)
        with self._lock:
            if label not in self._unpriced_models:
                if len(self._unpriced_models) >= UNPRICED_MODEL_LABELS:
                    label = "other"
                else:
                    self._unpriced_models.add(label)
        self._child(self.unpriced_calls, label).inc()

    def limiter_waited(self, provider: str, model: str, reason: str, seconds: float) -> None:
        """A job held back before its call; `reason` is one of LIMITER_REASONS (else `other`).
        Provider and model come from configuration; no key, user or job is a label."""
        label = reason if reason in LIMITER_REASONS else "other"
        self._child(self.limiter_waits, _label(provider), _label(model), label).inc()
        self._child(self.limiter_wait, label).observe(max(0.0, seconds))

    def estimate_checked(self, job_type: str, model: str, estimated: int, reported: int) -> None:
        """One answered call's reported input tokens against the job's estimate."""
        if estimated > 0 and reported > 0:
            self._child(self.estimate_ratio, _label(job_type), _label(model)).observe(
                reported / estimated
            )

    def execute_retry(self, job_type: str, error_code: str) -> None:
        self._child(self.execute_retries, _label(job_type), error_code_label(error_code)).inc()

    def reconciled(self, counts: dict[str, int], *, stuck: int, temporal_calls: int = 0) -> None:
        for action, n in counts.items():
            if n:
                self._child(self.reconciler_actions, action).inc(n)
        self.stuck_workflows.set(stuck)
        self.reconciler_temporal_calls.inc(temporal_calls)
        self.reconciler_last_pass.set(time.time())

    def reconciler_phase_failed(self, phase: str) -> None:
        self._child(self.reconciler_phase_failures, _label(phase)).inc()

    def relayed(self, event_type: str, outcome: str) -> None:
        self._child(self.relay_dispatch, _label(event_type), outcome).inc()

    def webhook_delivered(self, outcome: str) -> None:
        """One delivery attempt's recorded outcome (one of WEBHOOK_OUTCOMES; others ignored)."""
        if outcome in WEBHOOK_OUTCOMES:
            self._child(self.webhook_deliveries, outcome).inc()

    def poller_restarts_prepared(self, poller: str) -> None:
        """The poller's series exists at 0 from its start, so a rate over it is defined."""
        self._child(self.poller_restarts, _label(poller))

    def poller_restarted(self, poller: str) -> None:
        self._child(self.poller_restarts, _label(poller)).inc()

    def relay_lagged(self, queue: str, seconds: float) -> None:
        self._child(self.relay_lag, _label(queue)).observe(max(0.0, seconds))


@functools.cache
def worker_metrics() -> WorkerMetrics:
    """The families on the process-wide default registry (registered once per process)."""
    return WorkerMetrics()
