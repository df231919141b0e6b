"""The context the relay works on one outbox row in (activities/relay.py): the row's trace and
its job's log fields, so a workflow start joins the trace of the request that created the job
and the relay's log lines name the job."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry import context as otel_context

from db.outbox import OutboxRow
from engine.contracts import workflow_id
from engine.logcontext import bind_job, unbind
from jobs.tracecontext import context_from


@contextlib.contextmanager
def row_context(row: OutboxRow) -> Iterator[None]:
    """While working on one row: its trace context is current (or an empty one, never the
    relay's own), and log lines name its job."""
    p = row.payload if isinstance(row.payload, dict) else {}
    job_type = p.get("jobType") if isinstance(p.get("jobType"), str) else None
    queue = p.get("queueName") if isinstance(p.get("queueName"), str) else None
    wf_id = workflow_id(queue, job_type, row.aggregate_id) if queue and job_type else None
    job_token = bind_job(row.aggregate_id[:64], job_type, wf_id)
    trace_token = otel_context.attach(context_from(row.trace_context))
    try:
        yield
    finally:
        otel_context.detach(trace_token)
        unbind(job_token)
