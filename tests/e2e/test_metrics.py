"""What an operator scrapes: `GET /metrics` on the API and a worker's metrics endpoint, after real
jobs ran through the API, the relay and the in-process workers.

The counts must match the jobs (a delta of exactly the jobs run), every family must have the
documented type and label names, no label value may name a job or a user, and `/metrics` needs
no token.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import REGISTRY, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from runtime.embedded import free_port
from tests.e2e.conftest import Api
from tests.stack import Stack
from tests.support import until_passes

ALLOWED_LABELS = {
    "job_type",
    "status",
    "error_code",
    "queue",
    "provider",
    "model",
    "route",
    "method",
    "event_type",
    "action",
    "stage",  # aijobs_stage_duration_seconds: prepare | execute | project | finalize
    "le",  # histogram buckets
    "window",  # aijobs_cost_spent_usd: day | month
    "reason",  # aijobs_limiter_wait*: rpm | tpm | concurrency | announced | pause | breaker
    "poller",  # aijobs_poller_restarts_total: the supervised loops' names, fixed in the code
    "outcome",  # aijobs_flow_jobs_total: superseded | expired | deadline | held
}
Key = tuple[str, frozenset[tuple[str, str]]]

API_FAMILIES = {
    "aijobs_http_requests": ("counter", {"method", "route", "status"}),
    "aijobs_http_request_duration_seconds": ("histogram", {"method", "route", "status"}),
    "aijobs_jobs_active": ("gauge", {"job_type", "status"}),
    "aijobs_jobs_recent": ("gauge", {"job_type", "status"}),
    "aijobs_outbox_events": ("gauge", {"event_type", "status"}),
    "aijobs_outbox_oldest_pending_age_seconds": ("gauge", set()),
    "aijobs_metrics_sql_up": ("gauge", set()),
    "aijobs_cost_reserved_usd": ("gauge", set()),
    "aijobs_cost_spent_usd": ("gauge", {"window"}),
}
WORKER_FAMILIES = {
    "aijobs_jobs_finished": ("counter", {"job_type", "status", "error_code"}),
    "aijobs_stage_duration_seconds": ("histogram", {"stage"}),
    "aijobs_queue_wait_seconds": ("histogram", {"job_type", "queue"}),
    "aijobs_provider_calls": ("counter", {"provider", "model", "error_code"}),
    "aijobs_provider_call_duration_seconds": ("histogram", {"provider", "model"}),
    "aijobs_execute_retries": ("counter", {"job_type", "error_code"}),
    "aijobs_reconciler_actions": ("counter", {"action"}),
    "aijobs_stuck_workflows": ("gauge", set()),
    "aijobs_relay_lag_seconds": ("histogram", {"queue"}),
    "aijobs_relay_dispatch": ("counter", {"event_type", "status"}),
}


def parse(text: str) -> tuple[dict[str, str], dict[Key, float]]:
    """(family name → type, sample → value) of a Prometheus text exposition."""
    types: dict[str, str] = {}
    values: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            values[(s.name, frozenset(s.labels.items()))] = s.value
    return types, values


def value(samples: dict[Key, float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def delta(before: dict[Key, float], after: dict[Key, float], name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def label_sets(types: dict[str, str], text: str) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            names.setdefault(family.name, set()).update(k for k in s.labels if k != "le")
    return names


def assert_families(text: str, expected: dict[str, tuple[str, set[str]]]) -> None:
    types, _ = parse(text)
    labels = label_sets(types, text)
    for name, (kind, label_names) in expected.items():
        assert types.get(name) == kind, (name, types.get(name))
        assert labels.get(name, set()) == label_names, (name, labels.get(name))


def assert_clean_labels(text: str, forbidden: list[str]) -> None:
    """Only the allowed label names, and no value naming a job or a user."""
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("aijobs_"):
            continue
        for s in family.samples:
            assert set(s.labels) <= ALLOWED_LABELS, (s.name, s.labels)
            for v in s.labels.values():
                for word in forbidden:
                    assert word not in v, f"{word!r} in a label of {s.name}: {s.labels}"
                with pytest.raises(ValueError):
                    uuid.UUID(v.rsplit(":", 1)[-1])  # no id-shaped value at all


@pytest.fixture
def worker_port() -> Iterator[int]:
    """The in-process workers record into the default registry: serve it as `aijobs worker`
    does with WORKER_METRICS_PORT (same `start_http_server`), on a free port."""
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=REGISTRY)
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


async def scrape(url: str) -> str:
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.get(url)  # no Authorization header: a scraper carries none
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain"), r.headers["content-type"]
    return r.text


async def test_metrics_count_the_jobs_that_ran(api: Api, workers: Stack, worker_port: int) -> None:
    user = f"metrics-user-{uuid.uuid4().hex[:8]}"
    worker_url = f"http://127.0.0.1:{worker_port}/metrics"
    api_before = parse(await scrape(f"{api.base_url}/metrics"))[1]
    worker_before = parse(await scrape(worker_url))[1]

    plain = 3
    ids = [await api.create_id(user) for _ in range(plain)]
    # One succeeds on its retry; one fails on both attempts with a code a client chose.
    retried = await api.create_id(user, input={"failTimes": 1})
    failing = await api.create_id(
        user, input={"failTimes": 5, "failCode": "PROVIDER_CLIENT_CHOSEN_CODE"}
    )
    for job_id in ids:
        assert (await api.wait_status(job_id, user=user))["lifecycleStatus"] == "succeeded"
    assert (await api.wait_status(retried, user=user))["lifecycleStatus"] == "succeeded"
    failed = await api.wait_status(failing, user=user, timeout=40)
    assert failed["lifecycleStatus"] == "failed"
    all_ids = [*ids, retried, failing]
    succeeded = plain + 1

    # ---- the worker's endpoint --------------------------------------------------------------
    worker_text = await scrape(worker_url)
    assert_families(worker_text, WORKER_FAMILIES)
    after = parse(worker_text)[1]
    d = delta
    finished = "aijobs_jobs_finished_total"
    assert (
        d(worker_before, after, finished, job_type="synthetic", status="succeeded", error_code="")
        == succeeded
    )
    assert (
        d(
            worker_before,
            after,
            finished,
            job_type="synthetic",
            status="failed",
            error_code="PROVIDER_OTHER",
        )
        == 1
    ), "a client-chosen code must be reported under its family, not as a label value"
    retries = "aijobs_execute_retries_total"
    assert (
        d(worker_before, after, retries, job_type="synthetic", error_code="PROVIDER_UNAVAILABLE")
        == 1
    )
    assert d(worker_before, after, retries, job_type="synthetic", error_code="PROVIDER_OTHER") == 1
    calls = "aijobs_provider_calls_total"
    syn = {"provider": "synthetic", "model": "synthetic"}
    assert d(worker_before, after, calls, error_code="", **syn) == succeeded
    assert d(worker_before, after, calls, error_code="PROVIDER_UNAVAILABLE", **syn) == 1
    assert d(worker_before, after, calls, error_code="PROVIDER_OTHER", **syn) == 2
    assert d(worker_before, after, "aijobs_provider_call_duration_seconds_count", **syn) == 7
    stage = "aijobs_stage_duration_seconds_count"
    assert d(worker_before, after, stage, stage="execute") == 7  # 5 jobs, 2 of them twice
    assert d(worker_before, after, stage, stage="prepare") == 5
    assert d(worker_before, after, stage, stage="finalize") == 1
    assert d(worker_before, after, stage, stage="resolve") == 5
    assert d(worker_before, after, stage, stage="project") == succeeded
    assert d(worker_before, after, stage, stage="complete") == succeeded
    wait = "aijobs_queue_wait_seconds_count"
    assert d(worker_before, after, wait, job_type="synthetic", queue="ai-interactive") == 5
    started = "aijobs_relay_dispatch_total"
    assert d(worker_before, after, started, event_type="ai.job.enqueue", status="started") == 5
    assert d(worker_before, after, "aijobs_relay_lag_seconds_count", queue="ai-interactive") == 5
    assert_clean_labels(worker_text, [user, *all_ids])

    # ---- the API's endpoint -----------------------------------------------------------------
    async def api_state() -> str:
        text = await scrape(f"{api.base_url}/metrics")
        s = parse(text)[1]
        # SQL state (read at most every few seconds, so polled): exact for this test's jobs.
        assert value(s, "aijobs_metrics_sql_up") == 1
        assert value(s, "aijobs_jobs_recent", job_type="synthetic", status="succeeded") == 4
        assert value(s, "aijobs_jobs_recent", job_type="synthetic", status="failed") == 1
        for status in ("queued", "running"):
            assert value(s, "aijobs_jobs_active", job_type="synthetic", status=status) == 0
        assert (
            "aijobs_outbox_events",
            frozenset({("event_type", "ai.job.enqueue"), ("status", "dead")}),
        ) in s
        return text

    api_text = await until_passes(api_state)
    assert_families(api_text, API_FAMILIES)
    api_after = parse(api_text)[1]
    http = "aijobs_http_requests_total"
    assert d(api_before, api_after, http, method="POST", route="/api/ai/jobs", status="202") == 5
    polled = d(
        api_before, api_after, http, method="GET", route="/api/ai/jobs/{jobId}", status="200"
    )
    assert polled >= 5  # wait_status polls each job at least once
    routes = {dict(k[1]).get("route") for k in api_after if k[0] == http}
    assert "/metrics" not in routes, "the scrape endpoint counts itself"
    assert not any(r and any(i in r for i in all_ids) for r in routes), routes
    assert_clean_labels(api_text, [user, *all_ids])


async def test_metrics_need_no_token_and_say_so_in_openapi(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.base_url) as c:
        r = await c.get("/metrics")
        assert r.status_code == 200
        assert "# TYPE aijobs_http_requests_total counter" in r.text
        # A bad token is not even looked at.
        r = await c.get("/metrics", headers={"Authorization": "Bearer not-a-token"})
        assert r.status_code == 200
        doc = (await c.get("/openapi.json")).json()
    assert doc["paths"]["/metrics"]["get"]["security"] == []
    assert doc["security"] == [{"bearer": []}]  # everything else still needs the token


async def test_an_unrouted_request_is_counted_under_no_raw_path(api: Api) -> None:
    probe = f"/no-such-path/{uuid.uuid4()}"
    async with httpx.AsyncClient(base_url=api.base_url) as c:
        assert (await c.get(probe)).status_code == 404
        text = (await c.get("/metrics")).text
    assert probe not in text
    assert (
        value(
            parse(text)[1],
            "aijobs_http_requests_total",
            method="GET",
            route="unmatched",
            status="404",
        )
        >= 1
    )
