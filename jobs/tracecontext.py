"""The W3C trace context a job's enqueue carries from the create request to the relay.

It is stored in its own column of the outbox row (`outbox_event.trace_context`), never in the
payload or the job: it is not the job's data, and the relay only needs it to continue the
create request's trace when it starts the workflow. Only `traceparent` and `tracestate` are kept
(W3C baggage could carry whatever a client put in it).

With tracing off there is no valid current span: nothing is stored, and the relay starts each
workflow in an empty context.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_W3C = TraceContextTextMapPropagator()
_FIELDS = ("traceparent", "tracestate")


def current_trace_context() -> dict[str, str] | None:
    """The current span's context as W3C headers, or None when nothing is being traced."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier or None


def context_from(carrier: Mapping[str, object] | None) -> Context:
    """A context whose parent is the stored span, or an empty one (a new trace): never the
    caller's own context, so a long-lived relay span never adopts the jobs it dispatches."""
    if not carrier:
        return Context()
    fields = {k: v for k in _FIELDS if isinstance(v := carrier.get(k), str)}
    return _W3C.extract(fields, context=Context())
