"""The monitoring files in deploy/ agree with the code: every engine metric an alert or a
dashboard panel uses is one the engine exports, the scrape ports are the processes' defaults,
compose mounts what Prometheus and Grafana read, and (where promtool is installed) the rules
parse and fire on the series they are about."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from activities.metrics import WorkerMetrics
from api.metrics import ApiMetrics
from engine.settings import DEFAULT_TEMPORAL_METRICS_PORT, DEFAULT_WORKER_METRICS_PORT, Settings
from runtime.telemetry import tracing_from_env

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
_NAME = re.compile(r"\baijobs_[a-z0-9_]+")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported_names() -> set[str]:
    """Every sample name the API and a worker can expose (each on its own registry, as each
    process has: both count `aijobs_flow_jobs_total`)."""
    worker, api_reg = CollectorRegistry(), CollectorRegistry()
    WorkerMetrics(worker)
    api = ApiMetrics(["synthetic"], api_reg)
    api.state._snapshot.ok = True  # as after a successful read: its SQL families show
    names: set[str] = set()
    for reg in (worker, api_reg):
        for family in reg.collect():
            for suffix in _SUFFIXES.get(family.type, ("",)):
                names.add(family.name + suffix)
    return names


def _yaml(name: str) -> Any:
    return yaml.safe_load((DEPLOY / name).read_text())


def test_alerts_and_dashboard_use_only_exported_metrics() -> None:
    exported = exported_names()
    alerts = (DEPLOY / "alerts.yml").read_text()
    dashboard = (DEPLOY / "grafana" / "dashboards" / "aijobs.json").read_text()
    for where, text in (("alerts.yml", alerts), ("dashboard", dashboard)):
        used = set(_NAME.findall(text))
        assert used, where
        assert used <= exported, f"{where} uses unknown metrics: {sorted(used - exported)}"


def test_the_alerts_an_operator_needs_exist() -> None:
    rules = {r["alert"]: r for g in _yaml("alerts.yml")["groups"] for r in g["rules"]}
    needed = {
        "AijobsOutboxPendingTooOld": "aijobs_outbox_oldest_pending_age_seconds",
        "AijobsOutboxDeadRows": 'status="dead"',
        "AijobsOutboxFailedRows": 'status="failed"',
        "AijobsJobFailureRatioHigh": "aijobs_jobs_finished_total",
        "AijobsStuckWorkflows": "aijobs_stuck_workflows",
        "AijobsProviderErrorRateHigh": "aijobs_provider_calls_total",
        "AijobsWebhookBacklogOld": "aijobs_webhook_backlog_oldest_age_seconds",
        "AijobsWebhookDeliveriesFailing": "aijobs_webhook_deliveries_total",
    }
    for name, fragment in needed.items():
        assert fragment in rules[name]["expr"], name
    for rule in rules.values():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_scrape_config_matches_the_processes_and_compose() -> None:
    prod = Settings.model_validate({"AIJOBS_ENV": "production"})
    assert prod.worker_metrics_port == DEFAULT_WORKER_METRICS_PORT
    assert prod.temporal_metrics_port == DEFAULT_TEMPORAL_METRICS_PORT
    assert Settings.model_validate({"AIJOBS_ENV": "test"}).worker_metrics_port == 0
    jobs = {j["job_name"]: j for j in _yaml("prometheus.yml")["scrape_configs"]}
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    workers = {n for n in compose if n.startswith("worker-")}
    for job, port in (
        ("aijobs-worker", DEFAULT_WORKER_METRICS_PORT),
        ("temporal-sdk", DEFAULT_TEMPORAL_METRICS_PORT),
    ):
        (sd,) = jobs[job]["dns_sd_configs"]
        assert sd["port"] == port
        assert set(sd["names"]) == workers
    (api_sd,) = jobs["aijobs-api"]["dns_sd_configs"]
    assert api_sd["names"] == ["api"]
    assert str(api_sd["port"]) in compose["api"]["command"]
    assert jobs["aijobs-api"]["metrics_path"] == "/metrics"

    mounts = {v.split(":")[0]: v.split(":")[1] for v in compose["prometheus"]["volumes"]}
    assert mounts["./deploy/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert mounts["./deploy/alerts.yml"] in _yaml("prometheus.yml")["rule_files"]
    grafana = {v.split(":")[0]: v.split(":")[1] for v in compose["grafana"]["volumes"]}
    assert grafana["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = _yaml("grafana/provisioning/dashboards/aijobs.yml")["providers"][0]
    assert grafana["./deploy/grafana/dashboards"] == provider["options"]["path"]
    for name in ("prometheus", "grafana"):
        for port in compose[name]["ports"]:
            assert str(port).startswith("127.0.0.1:"), (name, port)


def test_dashboard_panels_use_the_provisioned_datasource() -> None:
    uid = _yaml("grafana/provisioning/datasources/prometheus.yml")["datasources"][0]["uid"]
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "aijobs.json").read_text())
    targets = [t for p in dash["panels"] for t in p.get("targets", [])]
    assert targets
    for t in targets:
        assert t["datasource"]["uid"] == uid
        assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_checks_and_unit_tests_the_rules(tmp_path: Path) -> None:
    ok = subprocess.run(
        ["promtool", "check", "rules", str(DEPLOY / "alerts.yml")], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    config = (DEPLOY / "prometheus.yml").read_text()
    local = tmp_path / "prometheus.yml"
    local.write_text(config.replace("/etc/prometheus/alerts.yml", str(DEPLOY / "alerts.yml")))
    ok = subprocess.run(["promtool", "check", "config", str(local)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    ok = subprocess.run(
        ["promtool", "test", "rules", "alerts_test.yml"],
        cwd=DEPLOY,
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_tracing_is_off_without_an_endpoint() -> None:
    off = tracing_from_env("aijobs-x", environ={})
    assert not off.enabled
    assert off.client_interceptors() == []
    disabled = tracing_from_env(
        "aijobs-x",
        environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"},
    )
    assert not disabled.enabled
