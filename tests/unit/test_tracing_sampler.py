"""The production tracing setting, `OTEL_TRACES_SAMPLER=parentbased_traceidratio` with
`OTEL_TRACES_SAMPLER_ARG=0.1` (docs/observability.md), reaches every process's tracer provider:
about one root trace in ten is kept, and a span inside a trace follows its parent's decision, so
a job's trace is kept whole or dropped whole across API, relay and worker. The bench's tracing
figure (docs/benchmarks.md) measures what that setting costs a worker."""

from __future__ import annotations

from typing import cast

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler

from runtime.telemetry import tracing_from_env, tracing_with_exporter

ROOTS = 4000


def _production_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.1")


def test_the_sampler_variables_configure_the_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    _production_sampler(monkeypatch)
    t = tracing_from_env("aijobs-x", environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    try:
        assert t.tracer_provider is not None
        sampler = t.tracer_provider.sampler
        assert isinstance(sampler, ParentBased)
        assert "TraceIdRatioBased{0.1}" in cast(Sampler, sampler).get_description()
    finally:
        t.shutdown()  # nothing was recorded: nothing to export


def test_without_them_every_trace_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    monkeypatch.delenv("OTEL_TRACES_SAMPLER_ARG", raising=False)
    t = tracing_with_exporter("aijobs-x", InMemorySpanExporter(), batch=False)
    assert t.tracer_provider is not None
    assert "AlwaysOnSampler" in t.tracer_provider.sampler.get_description()
    t.shutdown()


def test_a_tenth_of_roots_are_kept_and_children_follow(monkeypatch: pytest.MonkeyPatch) -> None:
    _production_sampler(monkeypatch)
    exporter = InMemorySpanExporter()
    t = tracing_with_exporter("aijobs-x", exporter, batch=False)
    assert t.tracer_provider is not None
    tracer = t.tracer_provider.get_tracer("test")
    kept_roots = 0
    for _ in range(ROOTS):
        with tracer.start_as_current_span("root") as root:
            with tracer.start_as_current_span("child") as child:
                # The child's decision is its parent's, never a second draw.
                assert child.is_recording() == root.is_recording()
                assert child.get_span_context().trace_flags.sampled == root.is_recording()
            kept_roots += root.is_recording()
    # Binomial(4000, 0.1): mean 400, standard deviation 19; ±100 is over 5 deviations.
    assert 300 <= kept_roots <= 500, kept_roots
    spans = exporter.get_finished_spans()
    assert len(spans) == 2 * kept_roots
    # A span continuing a remote parent (the relay's StartWorkflow seen from a worker) takes
    # the parent's decision even where its trace id's own draw says the opposite: the largest
    # trace id is never kept by the ratio alone, the smallest always.
    for trace_id, sampled in (((1 << 128) - 1, True), (1, False)):
        parent = trace.SpanContext(
            trace_id=trace_id,
            span_id=2,
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED if sampled else 0),
        )
        ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        with tracer.start_as_current_span("remote-child", context=ctx) as span:
            assert span.is_recording() == sampled
    t.shutdown()
