"""One trace per job, and nothing of the job in it (nor in the logs).

The stack is built as the processes build it: the Temporal client from `connect_temporal` with
the process's `Telemetry` (the tracing interceptor, inherited by the workers), the workers from
`build_workers` (the provider's HTTP client instrumented), the API from `create_app` plus
`Telemetry.instrument_app`. Only the exporter differs: in memory here, OTLP/HTTP in the second
test (to a small receiver on loopback, decoded as the collector would).

A sentinel travels in the job's input (so in the prompt, the provider request body and the
output); it must appear in no span attribute, event, status or resource, in no exported byte,
and in no log line, while the ids that should be there are.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from db.session import SessionMaker
from engine.settings import Settings
from runtime.embedded import free_port
from runtime.logs import build_handler
from runtime.telemetry import (
    SANITIZE_ENV,
    Telemetry,
    redact_query,
    tracing_from_env,
    tracing_with_exporter,
)
from runtime.wiring import api_app, connect_temporal
from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.provider_helpers import PLATFORM_KEY, auth, fake_env, user_prompts
from tests.stack import JOB_QUEUES, Stack, catalog_with, engine_stack, make_settings
from tests.support import eventually

JOB_TYPE = "flashcard_generation"


def sentinel() -> str:
    return f"SENTINEL{uuid.uuid4().hex}"


@asynccontextmanager
async def traced_stack(
    settings: Settings, telemetry: Telemetry
) -> AsyncIterator[tuple[Stack, httpx.AsyncClient]]:
    """Relay, workers and API wired with `telemetry`, the way `aijobs` wires its processes."""
    client = await connect_temporal(settings, telemetry=telemetry)
    app = api_app(settings)
    telemetry.instrument_app(app)
    async with (
        engine_stack(
            settings,
            client,
            queues=JOB_QUEUES,
            catalog=catalog_with(),
            telemetry=telemetry,
        ) as stack,
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as http,
    ):
        yield stack, http


async def run_job(
    stack: Stack, http: httpx.AsyncClient, settings: Settings, secret: str
) -> tuple[uuid.UUID, Any]:
    r = await http.post(
        "/api/ai/jobs",
        json={
            "jobType": JOB_TYPE,
            "targetType": "lesson",
            "targetId": "L-1",
            "input": {"sourceText": f"Ribosomes assemble proteins. {secret}", "count": 1},
        },
        headers=auth(settings, "trace-user"),
    )
    assert r.status_code == 202, r.text
    job_id = uuid.UUID(r.json()["jobId"])
    row = await stack.wait_status(job_id, "succeeded", "failed", timeout=30)
    assert row.lifecycle_status == "succeeded", (row.error_code, row.internal_error_message)
    return job_id, row


async def wait_spans(exporter: InMemorySpanExporter, *names: str) -> list[ReadableSpan]:
    seen: set[str] = set()

    async def exported() -> list[ReadableSpan] | None:
        nonlocal seen
        spans = list(exporter.get_finished_spans())
        seen = {s.name for s in spans}
        return spans if all(any(n == s or s.startswith(n) for s in seen) for n in names) else None

    return await eventually(
        exported,
        timeout=15,
        interval=0.1,
        what=lambda: f"spans {names} to be exported (seen {sorted(seen)})",
    )


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def tree(spans: list[ReadableSpan]) -> str:
    """The spans as an indented tree (for failure messages)."""
    by_parent: dict[int | None, list[ReadableSpan]] = {}
    ids = {s.context.span_id for s in spans}
    for s in sorted(spans, key=lambda s: s.start_time or 0):
        p = parent_of(s)
        by_parent.setdefault(p if p in ids else None, []).append(s)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for s in by_parent.get(parent, []):
            lines.append("  " * depth + s.name)
            walk(s.context.span_id, depth + 1)

    walk(None, 0)
    return "\n".join(lines)


async def test_one_trace_per_job_without_its_content(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    fake: FakeOpenAIServer,
) -> None:
    secret = sentinel()
    await fake.ascript(
        [], default={"kind": "valid", "content": {"flashcards": [{"front": "Q?", "back": secret}]}}
    )
    settings = make_settings(database_url, temporal_address, **fake_env(fake))
    exporter = InMemorySpanExporter()
    telemetry = tracing_with_exporter("aijobs-test", exporter, batch=False)
    log_stream = io.StringIO()
    handler = build_handler(log_stream, log_format="json", component="aijobs-test")
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        async with traced_stack(settings, telemetry) as (stack, http):
            job_id, row = await run_job(stack, http, settings, secret)
            spans = await wait_spans(
                exporter,
                "POST /api/ai/jobs",
                f"StartWorkflow:{JOB_TYPE}",
                f"RunWorkflow:{JOB_TYPE}",
                "RunActivity:execute",
                "POST",
            )
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        telemetry.shutdown()

    jid = str(job_id)
    api_span = one(spans, "POST /api/ai/jobs")
    trace_id = api_span.context.trace_id
    job_spans = [s for s in spans if s.context.trace_id == trace_id]
    shape = tree(job_spans)
    start = one(job_spans, f"StartWorkflow:{JOB_TYPE}")
    run = one(job_spans, f"RunWorkflow:{JOB_TYPE}")
    start_execute = one(job_spans, "StartActivity:execute")
    execute = one(job_spans, "RunActivity:execute")
    provider_calls = [
        s
        for s in job_spans
        if s.name == "POST" and "/chat/completions" in json.dumps(dict(s.attributes or {}))
    ]
    assert len(provider_calls) == 1, shape
    call = provider_calls[0]

    # One trace, and the causal chain API → relay → workflow → EXECUTE → provider request.
    # (The workflow's spans are siblings under StartWorkflow: RunWorkflow is a zero-length
    # marker, since a span left open across workflow tasks would not survive a replay.)
    assert parent_of(start) == api_span.context.span_id, shape
    assert parent_of(run) == start.context.span_id, shape
    assert parent_of(start_execute) == start.context.span_id, shape
    assert parent_of(execute) == start_execute.context.span_id, shape
    assert parent_of(call) == execute.context.span_id, shape
    assert {"RunActivity:prepare"} <= {s.name for s in job_spans}, shape

    # Ids, types, attempts as attributes.
    for span in (api_span, start, execute):
        attrs = dict(span.attributes or {})
        assert attrs.get("aijobs.job_id") == jid, (span.name, attrs)
        assert attrs.get("aijobs.job_type") == JOB_TYPE, (span.name, attrs)
    assert dict(execute.attributes or {}).get("aijobs.attempt") == 1
    assert dict(start.attributes or {}).get("temporalWorkflowID") == row.workflow_id
    assert api_span.resource.attributes["service.name"] == "aijobs-test"

    # Nothing the job carries, and no key, anywhere in any span of the run (though the
    # provider did receive both: the absence below means something).
    assert any(secret in p for p in await user_prompts(fake))
    assert f"Bearer {PLATFORM_KEY}" in (await fake.acalls())["authorizations"]
    for span in spans:
        blob = span.to_json()
        assert secret not in blob, f"the input leaked into span {span.name}"
        assert PLATFORM_KEY not in blob, f"the provider key leaked into span {span.name}"
        assert "authorization" not in blob.lower(), span.name

    # Logs: the sentinel is in none; each line about the job names it, its workflow and trace.
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines() if line.strip()]
    assert secret not in log_stream.getvalue()
    assert PLATFORM_KEY not in log_stream.getvalue()
    about_job = [line for line in lines if line.get("job_id") == jid]
    messages = {line["msg"] for line in about_job}
    assert {"job created", "job completed"} <= messages, messages
    for line in about_job:
        assert line.get("job_type") == JOB_TYPE, line
        assert line.get("workflow_id") == row.workflow_id, line
        assert line.get("trace_id") == format(trace_id, "032x"), line


# ---- OTLP/HTTP export ------------------------------------------------------------------------


class _Receiver(ThreadingHTTPServer):
    """Collects OTLP/HTTP trace exports (POST /v1/traces) as the raw bodies."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.content_types: list[str] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path == "/v1/traces":
                    with receiver.lock:
                        receiver.bodies.append(body)
                        receiver.content_types.append(self.headers.get("Content-Type", ""))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", free_port()), Handler)

    def requests(self) -> list[ExportTraceServiceRequest]:
        with self.lock:
            bodies = list(self.bodies)
        out = []
        for body in bodies:
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            out.append(req)
        return out


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    server = _Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


async def test_traces_are_exported_over_otlp_http_without_job_content(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    fake: FakeOpenAIServer,
    receiver: _Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = sentinel()
    await fake.ascript(
        [], default={"kind": "valid", "content": {"flashcards": [{"front": secret, "back": "A"}]}}
    )
    port = receiver.server_address[1]
    # What an operator sets: the standard variables, nothing of ours.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    # An operator who asks for every header: credentials are still redacted.
    for direction in ("CLIENT_REQUEST", "SERVER_REQUEST"):
        monkeypatch.setenv(f"OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_{direction}", ".*")
    monkeypatch.delenv(SANITIZE_ENV, raising=False)
    telemetry = tracing_from_env("aijobs-otlp-test")
    assert telemetry.enabled
    settings = make_settings(database_url, temporal_address, **fake_env(fake))
    try:
        async with traced_stack(settings, telemetry) as (stack, http):
            job_id, row = await run_job(stack, http, settings, secret)

            # The batch goes out on its own schedule (OTEL_BSP_SCHEDULE_DELAY), not at shutdown.
            async def batch_exported() -> bool:
                return any(
                    s.name == "RunActivity:execute"
                    for req in receiver.requests()
                    for rs in req.resource_spans
                    for ss in rs.scope_spans
                    for s in ss.spans
                )

            await eventually(
                batch_exported, timeout=15, interval=0.1, what="a batch exported on its schedule"
            )
    finally:
        telemetry.shutdown()  # flushes the rest

    assert all(ct == "application/x-protobuf" for ct in receiver.content_types)
    token = auth(settings, "trace-user")["Authorization"].split()[1]
    for body in receiver.bodies:
        assert secret.encode() not in body
        assert PLATFORM_KEY.encode() not in body
        assert token.encode() not in body
    assert any(b"[REDACTED]" in body for body in receiver.bodies), "headers were not captured"
    spans: list[Span] = []
    for req in receiver.requests():
        for rs in req.resource_spans:
            service = {
                a.key: a.value.string_value
                for a in rs.resource.attributes
                if a.key == "service.name"
            }
            assert service == {"service.name": "aijobs-otlp-test"}
            for ss in rs.scope_spans:
                spans.extend(ss.spans)
    by_name = {s.name: s for s in spans}
    api_span = by_name["POST /api/ai/jobs"]
    for name in (
        f"StartWorkflow:{JOB_TYPE}",
        f"RunWorkflow:{JOB_TYPE}",
        "RunActivity:execute",
        "POST",
    ):
        assert by_name[name].trace_id == api_span.trace_id, name
    attrs = {a.key: a.value for a in by_name["RunActivity:execute"].attributes}
    assert attrs["aijobs.job_id"].string_value == str(job_id)
    assert attrs["aijobs.attempt"].int_value == 1
    assert row.workflow_id in {
        a.value.string_value for a in by_name[f"StartWorkflow:{JOB_TYPE}"].attributes
    }


# ---- secrets in a request's query string ----------------------------------------------------


def test_redact_query_blanks_the_stream_token_only() -> None:
    assert redact_query(b"") == b""
    assert redact_query(b"a=1&streamToken=eyJ.x.y&b=2") == b"a=1&streamToken=[redacted]&b=2"
    # As the app reads the key: URL-decoded, and case-folded.
    assert redact_query(b"stream%54oken=s3cret") == b"stream%54oken=[redacted]"
    assert redact_query(b"STREAMTOKEN=s3cret&x") == b"STREAMTOKEN=[redacted]&x"
    assert redact_query(b"limit=5&cursor=abc") == b"limit=5&cursor=abc"


async def test_a_stream_token_reaches_no_exported_span(
    db: SessionMaker,
    database_url: str,
    temporal_address: str,
    receiver: _Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stream token in the query, on a job's event stream (200) and on another route (401):
    both server spans are exported over OTLP/HTTP, named after their routes, and no exported
    byte holds the token; even with every request header captured, no Authorization."""
    port = receiver.server_address[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    monkeypatch.setenv("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST", ".*")
    monkeypatch.delenv(SANITIZE_ENV, raising=False)
    telemetry = tracing_from_env("aijobs-otlp-stream")
    settings = make_settings(database_url, temporal_address)
    app = api_app(settings)
    telemetry.instrument_app(app)
    bearer = auth(settings, "stream-user")
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://api"
            ) as http,
        ):
            body = {"jobType": "synthetic", "targetType": "t", "targetId": "1", "input": {}}
            r = await http.post("/api/ai/jobs", json=body, headers=bearer)
            assert r.status_code == 202, r.text
            job_id = r.json()["jobId"]
            # Ended, so its stream ends after the terminal event (and its span with it).
            r = await http.post(f"/api/ai/jobs/{job_id}/cancel", headers=bearer)
            assert r.json()["lifecycleStatus"] == "cancelled", r.text
            r = await http.post("/api/ai/stream-tokens", headers=bearer)
            token = r.json()["token"]
            stream = await http.get(f"/api/ai/jobs/{job_id}/events", params={"streamToken": token})
            assert stream.status_code == 200, stream.text
            assert '"cancelled"' in stream.text
            other = await http.get(f"/api/ai/jobs/{job_id}", params={"streamToken": token})
            assert other.status_code == 401, other.text

            def server_spans() -> dict[str, Span]:
                return {
                    s.name: s
                    for req in receiver.requests()
                    for rs in req.resource_spans
                    for ss in rs.scope_spans
                    for s in ss.spans
                    if s.kind == Span.SPAN_KIND_SERVER
                }

            async def both_exported() -> dict[str, Span] | None:
                spans = server_spans()
                names = {"GET /api/ai/jobs/{jobId}/events", "GET /api/ai/jobs/{jobId}"}
                return spans if names <= set(spans) else None

            spans = await eventually(
                both_exported,
                timeout=15,
                interval=0.1,
                what=lambda: f"both server spans exported (seen {sorted(server_spans())})",
            )
    finally:
        telemetry.shutdown()

    assert receiver.bodies
    for blob in receiver.bodies:
        assert token.encode() not in blob
        assert token.split(".")[2].encode() not in blob  # not even the signature alone
        assert bearer["Authorization"].split()[1].encode() not in blob
    events = spans["GET /api/ai/jobs/{jobId}/events"]
    attrs = {a.key: a.value.string_value for a in events.attributes}
    assert attrs["http.route"] == "/api/ai/jobs/{jobId}/events"
    urls = [v for k, v in attrs.items() if k in ("http.url", "url.full", "http.target")]
    # The URL keeps its shape, the token's value is blanked (as in the access log).
    assert any(v.endswith("?streamToken=[redacted]") for v in urls), attrs
    status = {a.key: a.value.int_value for a in events.attributes}["http.status_code"]
    assert status == 200
    refused = {a.key: a.value for a in spans["GET /api/ai/jobs/{jobId}"].attributes}
    assert refused["http.status_code"].int_value == 401
