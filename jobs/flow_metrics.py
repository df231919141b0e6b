"""The metric of flow control (docs/api.md "Flow control", docs/admin.md "Operator pauses"):
jobs flow control ended or held, by job type and outcome. Part of a worker's `WorkerMetrics`
(activities/metrics.py, as `.flow`: expired, deadline, held) and of the API's `ApiMetrics`
(api/metrics.py: the jobs a create superseded), each on its process's registry. Job types come
from the catalog and the outcome from a fixed set: no user data in a label."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from engine.flow import JOB_DEADLINE_EXCEEDED, JOB_EXPIRED, SUPERSEDED

NAME = "aijobs_flow_jobs_total"
HELP = (
    "Jobs flow control acted on: superseded (a newer create with the key replaced it), expired "
    "(not started by its TTL), deadline (stopped at its deadline), held (an operator pause held "
    "it before a call; counted once per hold)."
)
OUTCOMES = ("superseded", "expired", "deadline", "held")
OUTCOME_OF_CODE = {
    SUPERSEDED: "superseded",
    JOB_EXPIRED: "expired",
    JOB_DEADLINE_EXCEEDED: "deadline",
}


def flow_counter(registry: CollectorRegistry) -> Counter:
    return Counter(NAME, HELP, ["job_type", "outcome"], registry=registry)


class FlowMetrics:
    """`aijobs_flow_jobs_total{job_type, outcome}` on a worker's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.jobs = flow_counter(registry)

    def ended(self, job_type: str, code: str) -> None:
        """A job flow control ended with `code` (SUPERSEDED, JOB_EXPIRED, ...)."""
        outcome = OUTCOME_OF_CODE.get(code)
        if outcome is not None:
            self.jobs.labels(job_type[:64] or "unknown", outcome).inc()

    def held(self, job_type: str) -> None:
        self.jobs.labels(job_type[:64] or "unknown", "held").inc()
