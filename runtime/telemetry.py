"""Traces and the metrics endpoints of a process, built from the environment.

Tracing follows the OpenTelemetry conventions: it is on when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, exported over OTLP/HTTP with protobuf
(`OTEL_EXPORTER_OTLP_PROTOCOL` / `..._TRACES_PROTOCOL` may ask for `grpc` when that exporter is
installed), batched as `OTEL_BSP_*` say, and the other `OTEL_EXPORTER_OTLP_*` variables (headers,
timeout, compression, certificates) are read by the exporter itself. `OTEL_SDK_DISABLED=true` or
`OTEL_TRACES_EXPORTER=none` turn it off. Off means off: no tracer provider, no interceptor, no
instrumented client, so nothing on the hot path does tracing work.

What is traced, one trace per job: the API's request span (FastAPI instrumentation), the relay's
`StartWorkflow:<jobType>` (Temporal's TracingInterceptor on the client, under the trace context
stored in the job's outbox row), `RunWorkflow`, each `StartActivity`/`RunActivity`, and the
provider's HTTP request (httpx instrumentation of the OpenAI-compatible client). Span attributes
are ids, types, attempts and codes. Request and response bodies are never recorded by these
instrumentations; header capture is opt-in through `OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_*`,
and the headers that carry credentials are always redacted even then. A query string's secret (a
stream token, `?streamToken=`) never reaches a span: the server span is started from the
request with that value replaced by `[redacted]` (its URL attributes, `http.url`/`url.full`,
`http.target`, `url.query`, are built from it), while the route itself reads the real one.

Every process names itself in `service.name`: `aijobs-api`, `aijobs-worker-<queues>`,
`aijobs-relay`, `aijobs-reconciler`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.util.http import parse_excluded_urls
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from temporalio import client as temporal_client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from activities.telemetry import JOB_ID, JOB_TYPE
from engine.contracts import JobWorkflowInput
from engine.settings import ConfigurationError, Settings
from providers.base import Provider
from providers.openai_compat import OpenAICompatibleProvider

log = logging.getLogger(__name__)

SANITIZE_ENV = "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS"
# Redacted in any span even when an operator asks for header capture.
SENSITIVE_HEADERS = (
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    "idempotency-key",
)
# Probes and scrapes would drown the job traces.
UNTRACED_PATHS = "/metrics$,/healthz$,/readyz$"
# Query parameters whose value is a secret (compared case-folded, after URL decoding): a span
# shows them as REDACTED, as the access log does (api/browser.py `RedactStreamToken`).
SECRET_QUERY_PARAMS = frozenset({"streamtoken"})
REDACTED = b"[redacted]"
# Where the request's own query string waits while the server span reads the redacted one.
_QUERY_KEY = "aijobs.query_string"


def service_name(role: str, queues: Sequence[str] = ()) -> str:
    """`aijobs-api`, `aijobs-worker-ai-interactive`, `aijobs-relay`, ..."""
    if role == "worker":
        return "aijobs-worker" + "".join(f"-{q}" for q in queues)
    if role == "reconcile":
        return "aijobs-reconciler"
    return f"aijobs-{role}"


@dataclass
class Telemetry:
    """One process's tracing: a tracer provider of its own, or None (tracing off).

    Tests build one around an in-memory exporter; production builds one from the environment
    (`tracing_from_env`) and installs it as the global provider."""

    service_name: str
    tracer_provider: TracerProvider | None = None

    @property
    def enabled(self) -> bool:
        return self.tracer_provider is not None

    def client_interceptors(self) -> list[temporal_client.Interceptor]:
        """For `Client.connect(interceptors=...)`: workers built from the client inherit the
        tracing interceptor (RunWorkflow, RunActivity spans)."""
        if self.tracer_provider is None:
            return []
        tracer = self.tracer_provider.get_tracer("aijobs.temporal")
        return [TracingInterceptor(tracer), _StartAttributes()]

    def instrument_app(self, app: FastAPI) -> None:
        """A server span per request, named after the route template (`POST /api/ai/jobs`),
        continuing a client's `traceparent`. The ASGI instrumentation wraps the whole stack,
        body limit included (FastAPI's own instrumentor insists on Starlette's default stack,
        which the app's outer layers replace)."""
        provider = self.tracer_provider
        if provider is None:
            return
        build_stack = app.build_middleware_stack

        def build_traced_stack() -> ASGIApp:
            return _RedactedQuery(
                OpenTelemetryMiddleware(
                    _RestoredQuery(_RouteSpanName(build_stack())),
                    excluded_urls=parse_excluded_urls(UNTRACED_PATHS),
                    default_span_details=_span_details,
                    tracer_provider=provider,
                    # The per-message receive/send spans say nothing an operator needs.
                    exclude_spans=["receive", "send"],
                    http_capture_headers_sanitize_fields=_sanitized_headers(os.environ),
                )
            )

        app.build_middleware_stack = build_traced_stack  # type: ignore[method-assign]

    def instrument_provider(self, provider: Provider | None) -> None:
        """The provider's HTTP requests as child spans of EXECUTE: method, URL (no key in it),
        status and duration; never the body (prompts) or the Authorization header."""
        if self.tracer_provider is None or not isinstance(provider, OpenAICompatibleProvider):
            return
        _redact_sensitive_headers(os.environ)
        HTTPXClientInstrumentor.instrument_client(
            provider.http_client, tracer_provider=self.tracer_provider
        )

    def install_global(self) -> None:
        """Make this the process's global tracer provider (an entry point does this once)."""
        if self.tracer_provider is not None:
            trace.set_tracer_provider(self.tracer_provider)

    def shutdown(self) -> None:
        """Flush what is batched, then stop exporting."""
        if self.tracer_provider is not None:
            try:
                self.tracer_provider.shutdown()
            except Exception:  # an unreachable collector must not turn a clean exit into a crash
                log.warning("trace exporter shutdown failed")


def tracing_with_exporter(name: str, exporter: SpanExporter, *, batch: bool = True) -> Telemetry:
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    return Telemetry(name, provider)


def tracing_from_env(name: str, environ: Mapping[str, str] | None = None) -> Telemetry:
    """Tracing as the `OTEL_*` variables say (see the module docstring); raises
    ConfigurationError for a protocol this installation cannot speak."""
    env = os.environ if environ is None else environ
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if (
        not endpoint
        or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
        or env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none"
    ):
        return Telemetry(name)
    return tracing_with_exporter(name, _otlp_exporter(env))


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter:
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as GrpcSpanExporter,
            )
        except ImportError:
            raise ConfigurationError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc "
                "installed; or use http/protobuf (the default)"
            ) from None
        exporter: SpanExporter = GrpcSpanExporter()
        return exporter
    raise ConfigurationError(
        f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol[:32]!r} is not supported; "
        "use http/protobuf (the default) or grpc"
    )


def _span_details(scope: Scope) -> tuple[str, dict[str, str]]:
    """The span's first name, the method alone: the route is known only once the router ran
    (`_RouteSpanName` renames it then). Never the raw path, which holds ids."""
    return str(scope.get("method", "HTTP")), {}


def redact_query(query: bytes) -> bytes:
    """`query` with the value of every SECRET_QUERY_PARAMS parameter replaced by REDACTED; the
    other pairs unchanged, byte for byte. A key is compared as the app reads it (URL-decoded,
    so `stream%54oken` is caught too), case-folded."""
    if not query:
        return query
    pairs = query.split(b"&")
    out = []
    for pair in pairs:
        key, eq, _ = pair.partition(b"=")
        if unquote_plus(key.decode("latin-1")).casefold() in SECRET_QUERY_PARAMS:
            pair = key + b"=" + REDACTED if eq else pair
        out.append(pair)
    return b"&".join(out)


class _RedactedQuery:
    """Outside the tracing middleware: the request's scope as the server span reads it, its
    query string's secrets redacted (a copy: the real one travels under _QUERY_KEY, for
    `_RestoredQuery`). The tracing middleware builds every URL attribute from this copy when
    it starts the span, and records nothing of the query later."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = scope.get("query_string", b"")
        if scope["type"] not in ("http", "websocket") or not query:
            await self.app(scope, receive, send)
            return
        await self.app(
            {**scope, "query_string": redact_query(query), _QUERY_KEY: query}, receive, send
        )


class _RestoredQuery:
    """Inside the tracing middleware: the app reads the request's real query string (the same
    scope dict the middleware holds, so the route the router records stays visible to it), and
    the redacted one is put back once the app is done, before the middleware's span ends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if _QUERY_KEY not in scope:
            await self.app(scope, receive, send)
            return
        redacted = scope["query_string"]
        scope["query_string"] = scope.pop(_QUERY_KEY)
        try:
            await self.app(scope, receive, send)
        finally:
            scope["query_string"] = redacted


class _RouteSpanName:
    """Inside the server span: once routed, the span is named `METHOD /route/{template}` and
    carries `http.route` (the router records the matched route in the scope)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        span = trace.get_current_span()

        async def send_named(message: Message) -> None:
            if message["type"] == "http.response.start":
                _name_after_route(span, scope)
            await send(message)

        try:
            await self.app(scope, receive, send_named)
        finally:
            _name_after_route(span, scope)


def _name_after_route(span: trace.Span, scope: Scope) -> None:
    template = getattr(scope.get("route"), "path", None)
    if isinstance(template, str) and span.is_recording():
        span.update_name(f"{scope.get('method', 'HTTP')} {template}")
        span.set_attribute("http.route", template)


def _sanitized_headers(env: Mapping[str, str]) -> list[str]:
    extra = [h.strip() for h in env.get(SANITIZE_ENV, "").split(",") if h.strip()]
    return [*SENSITIVE_HEADERS, *extra]


def _redact_sensitive_headers(env: MutableMapping[str, str]) -> None:
    """The httpx instrumentation reads its redaction list from the environment only."""
    env[SANITIZE_ENV] = ",".join(dict.fromkeys(_sanitized_headers(env)))


class _StartAttributes(temporal_client.Interceptor):
    """Puts the job's id and type on the StartWorkflow span (inside the tracing interceptor,
    where that span is current)."""

    def intercept_client(
        self, next: temporal_client.OutboundInterceptor
    ) -> temporal_client.OutboundInterceptor:
        return _StartAttributesOutbound(next)


class _StartAttributesOutbound(temporal_client.OutboundInterceptor):
    async def start_workflow(
        self, input: temporal_client.StartWorkflowInput
    ) -> temporal_client.WorkflowHandle[Any, Any]:
        arg = input.args[0] if input.args else None
        span = trace.get_current_span()
        if isinstance(arg, JobWorkflowInput) and span.is_recording():
            span.set_attributes({JOB_ID: arg.jobId, JOB_TYPE: arg.jobType})
        return await super().start_workflow(input)


# ---- metrics endpoints ---------------------------------------------------------------------


def start_metrics_server(settings: Settings) -> str | None:
    """Serve the process's Prometheus registry on WORKER_METRICS_PORT; the URL, or None when
    the port is 0."""
    if not settings.worker_metrics_port:
        return None
    from prometheus_client import start_http_server

    try:
        start_http_server(settings.worker_metrics_port, addr=settings.metrics_host)
    except OSError as exc:
        # Metrics must never stop a worker from working: say so and carry on without them.
        log.error(
            "worker metrics endpoint not started",
            extra={"port": settings.worker_metrics_port, "error_type": type(exc).__name__},
        )
        return None
    return f"http://{settings.metrics_host}:{settings.worker_metrics_port}/metrics"


def temporal_runtime(settings: Settings) -> Runtime | None:
    """A Temporal SDK runtime serving the SDK's own metrics on TEMPORAL_METRICS_PORT (None: the
    default runtime, no metrics endpoint). Pass it to `Client.connect` before any worker."""
    if not settings.temporal_metrics_port:
        return None
    address = f"{settings.metrics_host}:{settings.temporal_metrics_port}"
    if not _port_free(settings.metrics_host, settings.temporal_metrics_port):
        log.error("Temporal SDK metrics endpoint not started", extra={"address": address})
        return None
    return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=address)))


def _port_free(host: str, port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
