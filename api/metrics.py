"""The API's Prometheus metrics and `GET /metrics`.

Two kinds of families, on one registry per app (a process runs one app; tests run several):

- HTTP requests, counted by a pure ASGI layer outside everything else (a 413 refused before
  routing is counted too): method, the route's *template* (`/api/ai/jobs/{jobId}`, never the
  raw path: one series per job id would grow without bound) and status;
- the engine's state, read from PostgreSQL when Prometheus scrapes (`EngineStateCollector`).

`GET /metrics` needs no token (scrapers do not carry one; nothing it shows names a job or a
user) and is not counted in the request metrics it serves. It is in the OpenAPI document with an
empty `security`, so clients see it needs no bearer token.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from db import budgets as budgets_db
from db import webhook_deliveries as webhooks_db
from db.metrics import read_engine_state
from db.outbox import CANCELLED, COMPLETED, ENQUEUE, FAILED
from db.session import SessionMaker
from engine.lifecycle import ACTIVE_VALUES
from jobs.flow_metrics import FlowMetrics

METRICS_PATH = "/metrics"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_EVENT_TYPES = (ENQUEUE, COMPLETED, FAILED, CANCELLED)
_ACTIVE = ACTIVE_VALUES
_OUTBOX_STATES = ("pending", "processing", "failed", "dead")
_HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class _Snapshot:
    active: dict[tuple[str, str], int] = field(default_factory=dict)
    recent: dict[tuple[str, str], int] = field(default_factory=dict)
    outbox: dict[tuple[str, str], int] = field(default_factory=dict)
    oldest_pending_s: float = 0.0
    webhook_backlog_s: float = 0.0
    reserved_usd: float = 0.0
    spent_today_usd: float = 0.0
    spent_month_usd: float = 0.0
    ok: bool = False
    took_s: float = 0.0


class EngineStateCollector(Collector):
    """Jobs and outbox rows by state, read from PostgreSQL at scrape time, never by a full scan:

    - `aijobs_jobs_active{job_type,status}`: exact counts of `queued` and `running` jobs. Only
      non-terminal rows are read, through the partial index on them (`ix_ai_job_user_active`,
      `lifecycle_status IN ('queued','running')`): the cost follows the backlog, not the table.
    - `aijobs_jobs_recent{job_type,status}`: terminal jobs created within the last
      `recent_window_s` (default one hour), by an index range scan on
      `(lifecycle_status, created_at)`. A terminal total over all time would need a full count
      of a table that only grows; rates of finished jobs come from the workers' counters
      (`aijobs_jobs_finished_total`), this gauge is the recent picture as SQL sees it.
    - `aijobs_outbox_events{event_type,status}`: pending, processing, failed and dead rows, each
      served by its partial index; published rows (history, deleted after retention) are left
      out. `aijobs_outbox_oldest_pending_age_seconds`: how long the oldest pending row has
      waited (0 when none), read from the pending rows only.
    - `aijobs_webhook_backlog_oldest_age_seconds`: how long the oldest due, undelivered webhook
      delivery has waited for a deliverer (0 when none), from the due-rows index.
    - `aijobs_cost_reserved_usd` and `aijobs_cost_spent_usd{window}`: the open reservations of
      active jobs (same partial index) and the calls' cost this UTC day and month (a range of
      the daily rollup's key): reserved versus spent, for every user together.

    The queries run with a short statement timeout and at most once per `min_interval_s`
    (several Prometheus replicas scraping share one read). `aijobs_metrics_sql_up` says whether
    the last read worked; when it did not, the SQL families are left out rather than shown stale.
    """

    def __init__(
        self,
        job_types: Iterable[str] = (),
        *,
        recent_window_s: float = 3600.0,
        min_interval_s: float = 5.0,
        timeout_s: float = 3.0,
    ) -> None:
        self._job_types = tuple(job_types)
        self.recent_window_s = recent_window_s
        self.min_interval_s = min_interval_s
        self.timeout_s = timeout_s
        self._snapshot = _Snapshot()
        self._read_at = -1e9
        self._lock = asyncio.Lock()

    async def refresh(self, sessionmaker: SessionMaker) -> None:
        """Read the state now unless a read finished less than `min_interval_s` ago."""
        async with self._lock:  # concurrent scrapes wait for one read instead of each reading
            if time.monotonic() - self._read_at < self.min_interval_s:
                return
            started = time.monotonic()
            try:
                async with asyncio.timeout(self.timeout_s):
                    snap = await self._read(sessionmaker)
                snap.ok = True
            except Exception:  # the database is down or slow: report that, not stale numbers
                snap = _Snapshot()
            snap.took_s = time.monotonic() - started
            self._snapshot = snap
            self._read_at = time.monotonic()

    async def _read(self, sessionmaker: SessionMaker) -> _Snapshot:
        async with sessionmaker.begin() as s:
            state = await read_engine_state(
                s, recent_window_s=self.recent_window_s, timeout_s=self.timeout_s
            )
            # In the same transaction: the statement timeout set above bounds it too.
            backlog_s = await webhooks_db.oldest_due_age_s(s)
            money = await budgets_db.reserved_and_spent(s)
        snap = _Snapshot(
            active=state.active,
            recent=state.recent,
            oldest_pending_s=state.oldest_pending_s,
            webhook_backlog_s=backlog_s,
            reserved_usd=float(money.reserved_usd),
            spent_today_usd=float(money.spent_today_usd),
            spent_month_usd=float(money.spent_month_usd),
        )
        for (event_type, status), n in state.outbox.items():
            key = (event_type if event_type in _EVENT_TYPES else "other", status)
            snap.outbox[key] = snap.outbox.get(key, 0) + n
        return snap

    def describe(self) -> list[Metric]:
        return []  # families vary with the data; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot
        up = GaugeMetricFamily(
            "aijobs_metrics_sql_up", "1 if the last read of the engine's state from SQL worked."
        )
        up.add_metric([], 1.0 if snap.ok else 0.0)
        yield up
        took = GaugeMetricFamily(
            "aijobs_metrics_sql_duration_seconds", "How long the last read of the state took."
        )
        took.add_metric([], snap.took_s)
        yield took
        if not snap.ok:
            return
        active = GaugeMetricFamily(
            "aijobs_jobs_active",
            "Jobs waiting (queued) or being worked on (running), exact.",
            labels=["job_type", "status"],
        )
        for key, n in _with_zeros(snap.active, self._job_types, _ACTIVE):
            active.add_metric(list(key), n)
        yield active
        recent = GaugeMetricFamily(
            "aijobs_jobs_recent",
            f"Terminal jobs created in the last {self.recent_window_s:g} s, by final state.",
            labels=["job_type", "status"],
        )
        for key, n in sorted(snap.recent.items()):
            recent.add_metric(list(key), n)
        yield recent
        outbox = GaugeMetricFamily(
            "aijobs_outbox_events",
            "Outbox rows not yet published (pending, processing, failed, dead).",
            labels=["event_type", "status"],
        )
        for key, n in _with_zeros(snap.outbox, (ENQUEUE,), _OUTBOX_STATES):
            outbox.add_metric(list(key), n)
        yield outbox
        age = GaugeMetricFamily(
            "aijobs_outbox_oldest_pending_age_seconds",
            "Age of the oldest pending outbox row (0 when none is pending).",
        )
        age.add_metric([], snap.oldest_pending_s)
        yield age
        backlog = GaugeMetricFamily(
            "aijobs_webhook_backlog_oldest_age_seconds",
            "How long the oldest due, undelivered webhook delivery has waited for a deliverer "
            "(0 when none is due).",
        )
        backlog.add_metric([], snap.webhook_backlog_s)
        yield backlog
        reserved = GaugeMetricFamily(
            "aijobs_cost_reserved_usd",
            "What active jobs hold against their users' cost budgets beyond what they spent.",
        )
        reserved.add_metric([], snap.reserved_usd)
        yield reserved
        spent = GaugeMetricFamily(
            "aijobs_cost_spent_usd",
            "What provider calls cost in the current UTC budget window (day, month).",
            labels=["window"],
        )
        spent.add_metric(["day"], snap.spent_today_usd)
        spent.add_metric(["month"], snap.spent_month_usd)
        yield spent


def _with_zeros(
    counts: dict[tuple[str, str], int], firsts: Sequence[str], seconds: Sequence[str]
) -> list[tuple[tuple[str, str], int]]:
    """The counts, plus 0 for every expected pair SQL had no row for (a dashboard shows 0, an
    alert compares with 0, instead of a missing series)."""
    out = dict(counts)
    for a in firsts:
        for b in seconds:
            out.setdefault((a, b), 0)
    return sorted(out.items())


class ApiMetrics:
    """The API's families on its own registry (with the process collectors), and the state
    collector that `GET /metrics` refreshes before it renders."""

    def __init__(
        self,
        job_types: Iterable[str] = (),
        registry: CollectorRegistry | None = None,
        *,
        recent_window_s: float = 3600.0,
    ) -> None:
        if registry is None:
            registry = CollectorRegistry()
            for c in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
                registry.register(c)
        self.registry = registry
        self.requests = Counter(
            "aijobs_http_requests_total",
            "HTTP requests answered, by method, route template and status.",
            ["method", "route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "aijobs_http_request_duration_seconds",
            "Time from request to the end of the response, by method, route template, status.",
            ["method", "route", "status"],
            buckets=_HTTP_BUCKETS,
            registry=registry,
        )
        # The jobs a create superseded (the workers count the other outcomes).
        self.flow = FlowMetrics(registry)
        self.state = EngineStateCollector(job_types, recent_window_s=recent_window_s)
        registry.register(self.state)
        self._children: dict[tuple[str, str, str], tuple[Any, Any]] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, str(status))
        pair = self._children.get(key)
        if pair is None:
            pair = (self.requests.labels(*key), self.latency.labels(*key))
            self._children[key] = pair
        pair[0].inc()
        pair[1].observe(seconds)

    async def render(self, sessionmaker: SessionMaker) -> bytes:
        await self.state.refresh(sessionmaker)
        return generate_latest(self.registry)


class HttpMetrics:
    """Pure ASGI (no per-request task or body buffering, unlike BaseHTTPMiddleware)."""

    def __init__(self, app: ASGIApp, *, metrics: ApiMetrics, routes_of: FastAPI) -> None:
        self.app = app
        self.metrics = metrics
        self.routes_of = routes_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == METRICS_PATH:
            await self.app(scope, receive, send)
            return
        status = 500  # what the client sees if the app raises before it answers

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        started = time.perf_counter()
        try:
            await self.app(scope, receive, send_status)
        finally:
            method = scope.get("method", "OTHER")
            self.metrics.observe(
                method if method in _METHODS else "OTHER",
                self._route(scope),
                status,
                time.perf_counter() - started,
            )

    def _route(self, scope: Scope) -> str:
        route = scope.get("route")
        path = getattr(route, "path", None)
        if isinstance(path, str):
            return path
        # Not routed (refused before routing, e.g. 413; or no route matched): find the template
        # the way the router would, or call it unmatched. Never the raw path.
        for candidate in self.routes_of.router.routes:
            match, _ = candidate.matches(scope)
            if match != Match.NONE:
                return str(getattr(candidate, "path", "unmatched"))
        return "unmatched"


router = APIRouter(tags=["health"])


@router.get(
    METRICS_PATH,
    summary="Prometheus metrics",
    description="Prometheus text format; no token needed (nothing here names a job or a user).",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
    openapi_extra={"security": []},
)
async def metrics_endpoint(request: Request) -> Response:
    metrics: ApiMetrics = request.app.state.metrics
    body = await metrics.render(request.app.state.aijobs.sessionmaker)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def install(app: FastAPI, metrics: ApiMetrics) -> None:
    """`GET /metrics` and the request metrics as the outermost layer (outside the body limit
    too). Call after every other `install` that wraps the middleware stack."""
    app.state.metrics = metrics
    app.include_router(router)
    build_stack = app.build_middleware_stack

    def build_measured_stack() -> ASGIApp:
        return HttpMetrics(build_stack(), metrics=metrics, routes_of=app)

    app.build_middleware_stack = build_measured_stack  # type: ignore[method-assign]
