"""The arithmetic of `python -m bench.capacity`, with no I/O: Temporal Cloud actions counted from
a workflow's history, the Temporal server's Prometheus text parsed, and the capacity model that
turns per-job figures into cores, database load, history shards, provider keys and money.

Actions are counted the way Temporal Cloud's "Actions" page (docs.temporal.io/cloud/actions)
defines them, from the events a history shows:
- workflow started (a client start, a continue-as-new's new run, a child's start): 1;
- activity scheduled: 1, plus one per retry (`ActivityTaskStarted.attempt - 1`);
- local activities: all the markers one workflow task records count as 1, plus one per
  non-first local attempt (`WorkflowTaskCompleted.metering_metadata`); a workflow task whose
  only markers are version (patch) markers is counted the same way, which overcounts if Cloud
  exempts them (the page exempts the `TemporalChangeVersion` search attribute, not the marker);
- timer started, signal received, search-attribute upsert (not one that only sets
  `TemporalChangeVersion`), update accepted, execution options updated, Nexus operation
  scheduled or cancel requested: 1 each; a child workflow's start initiated: 2;
- a run a schedule started (`TemporalScheduledById` among its start's search attributes): the
  schedule's own 2 actions beside the run's start.
What no history shows (activity heartbeats that reach the server, queries, a schedule's own two
actions per run) is read from the server's `action` metric instead, which the caller reports
beside the history count. The invariant the unit tests pin: one count per rule above, nothing
counted twice.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

ROLES = ("api", "interactive", "background", "system", "postgres", "temporal")
ENGINE_ROLES = ("api", "interactive", "background", "system")
LOCAL_ACTIVITY_MARKER = "core_local_activity"
CHANGE_VERSION_SA = "TemporalChangeVersion"
SCHEDULED_BY_SA = "TemporalScheduledById"
# Temporal Cloud's pay-as-you-go action tiers (Business plan and up): (millions in the tier,
# USD per million). Beyond the last tier the page says "contact sales"; the model prices it at
# the last published rate and says so.
ACTION_TIERS: tuple[tuple[float, float], ...] = (
    (5, 50.0),
    (5, 45.0),
    (10, 40.0),
    (30, 35.0),
    (50, 30.0),
    (100, 25.0),
)
SECONDS_PER_MONTH = 30 * 24 * 3600

_ONE_ACTION = {
    "EVENT_TYPE_WORKFLOW_EXECUTION_STARTED": "workflow started",
    "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED": "activity scheduled",
    "EVENT_TYPE_TIMER_STARTED": "timer started",
    "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED": "signal",
    "EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED": "update accepted",
    "EVENT_TYPE_WORKFLOW_EXECUTION_OPTIONS_UPDATED": "options updated",
    "EVENT_TYPE_NEXUS_OPERATION_SCHEDULED": "nexus operation",
    "EVENT_TYPE_NEXUS_OPERATION_CANCEL_REQUESTED": "nexus operation",
}


@dataclass
class HistoryCount:
    """Events and billable actions of one or more histories (or of their events in a window)."""

    histories: int = 0
    events: int = 0
    actions: Counter[str] = field(default_factory=Counter)
    event_types: Counter[str] = field(default_factory=Counter)

    @property
    def total_actions(self) -> int:
        return sum(self.actions.values())

    def add(self, other: HistoryCount) -> None:
        self.histories += other.histories
        self.events += other.events
        self.actions.update(other.actions)
        self.event_types.update(other.event_types)


def count_history(
    events: Iterable[Any],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
) -> HistoryCount:
    """Count one history's events (`temporalio.api.history.v1.HistoryEvent`) and their actions;
    with `since`/`until`, only the events whose `event_time` falls in [since, until)."""
    from temporalio.api.enums.v1 import EventType

    out = HistoryCount(histories=1)
    marker_tasks: dict[int, bool] = {}  # workflow task completed id -> any local activity marker
    for e in events:
        when = e.event_time.ToDatetime().replace(tzinfo=None)
        if (since is not None and when < since) or (until is not None and when >= until):
            continue
        name = EventType.Name(e.event_type)
        out.events += 1
        out.event_types[name.removeprefix("EVENT_TYPE_").lower()] += 1
        if name in _ONE_ACTION:
            out.actions[_ONE_ACTION[name]] += 1
            started = e.workflow_execution_started_event_attributes
            if SCHEDULED_BY_SA in started.search_attributes.indexed_fields:
                out.actions["schedule (two per scheduled run)"] += 2
        elif name == "EVENT_TYPE_ACTIVITY_TASK_STARTED":
            retries = e.activity_task_started_event_attributes.attempt - 1
            if retries > 0:
                out.actions["activity retried"] += retries
        elif name == "EVENT_TYPE_MARKER_RECORDED":
            a = e.marker_recorded_event_attributes
            task = a.workflow_task_completed_event_id
            local = a.marker_name == LOCAL_ACTIVITY_MARKER
            marker_tasks[task] = marker_tasks.get(task, False) or local
        elif name == "EVENT_TYPE_WORKFLOW_TASK_COMPLETED":
            meta = e.workflow_task_completed_event_attributes.metering_metadata
            if meta.nonfirst_local_activity_execution_attempts:
                out.actions["local activity retried"] += (
                    meta.nonfirst_local_activity_execution_attempts
                )
        elif name == "EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES":
            fields = e.upsert_workflow_search_attributes_event_attributes.search_attributes
            if set(fields.indexed_fields) - {CHANGE_VERSION_SA}:
                out.actions["search attributes upserted"] += 1
        elif name == "EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED":
            out.actions["child workflow started"] += 2
    for local in marker_tasks.values():
        out.actions["local activities (one per workflow task)" if local else "version markers"] += 1
    return out


# ---- the Temporal server's metrics ----------------------------------------------------------

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of metric `name` (or `name_total`) in Prometheus text format."""
    out: list[tuple[dict[str, str], float]] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None or m.group(1) not in (name, f"{name}_total"):
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        try:
            out.append((labels, float(m.group(3))))
        except ValueError:
            continue
    return out


def metric_by(
    samples: list[tuple[dict[str, str], float]], label: str, where: Mapping[str, str] | None = None
) -> Counter[str]:
    """Sum of the samples per value of `label`, keeping only samples whose labels match
    `where`."""
    out: Counter[str] = Counter()
    for labels, value in samples:
        if where and any(labels.get(k) != v for k, v in where.items()):
            continue
        out[labels.get(label, "")] += int(value)
    return out


def counter_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    keys = set(before) | set(after)
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted(keys)}


# ---- the capacity model ---------------------------------------------------------------------


@dataclass(frozen=True)
class Assumptions:
    """What the model does not measure, each a flag of `python -m bench.capacity`."""

    utilisation: float = 0.6  # target CPU utilisation of a core
    cores_per_machine: int = 8
    pg_max_tps: float = 10_000.0  # write transactions/s one primary sustains
    pg_max_wal_mb_s: float = 50.0  # WAL MB/s one primary (and its replicas, archiving) sustains
    shard_events_per_s: float = 100.0  # history events/s one history shard is planned for
    action_price_per_million: float = 50.0  # first published tier, USD
    cloud_namespace_aps: float = 500.0  # Temporal Cloud's default namespace limit
    provider_rpm: float = 500.0  # docs/limits.md's AI_MODEL_LIMITS example (deepseek-chat)
    provider_tpm: float = 1_000_000.0


def tiered_cost(actions: float, tiers: tuple[tuple[float, float], ...] = ACTION_TIERS) -> float:
    """USD for `actions` actions in one month through the published tiers; what lies beyond the
    last tier is priced at the last tier's rate."""
    left, cost = actions, 0.0
    for millions, usd in tiers:
        take = min(left, millions * 1e6)
        cost += take / 1e6 * usd
        left -= take
        if left <= 0:
            return cost
    return cost + left / 1e6 * tiers[-1][1]


def next_power_of_two(n: float) -> int:
    return 1 if n <= 1 else 2 ** math.ceil(math.log2(n))


def cores(cpu_ms_per_job: float, jobs_per_s: float, utilisation: float) -> float:
    """Cores a role needs: CPU ms per job * jobs/s / 1000, at the target utilisation."""
    return cpu_ms_per_job * jobs_per_s / 1000.0 / utilisation


def model(per_job: Mapping[str, Any], rate: float, a: Assumptions) -> dict[str, Any]:
    """What `rate` jobs/s needs, from the run's per-job figures: `cpu_ms` (per role),
    `transactions`, `wal_bytes`, `history_events`, `actions`, `provider_calls`, `tokens`, and
    the system workflows' fixed `system_events_per_s` and `system_actions_per_s`."""
    role_cores = {r: cores(per_job["cpu_ms"].get(r, 0.0), rate, a.utilisation) for r in ROLES}
    tps = per_job["transactions"] * rate
    wal_mb_s = per_job["wal_bytes"] * rate / 1e6
    events_s = per_job["history_events"] * rate + per_job.get("system_events_per_s", 0.0)
    actions_s = per_job["actions"] * rate + per_job.get("system_actions_per_s", 0.0)
    shards = events_s / a.shard_events_per_s
    calls_s = per_job["provider_calls"] * rate
    tokens_min = per_job["tokens"] * rate * 60
    keys = max(calls_s * 60 / a.provider_rpm, tokens_min / a.provider_tpm)
    monthly_actions = actions_s * SECONDS_PER_MONTH
    return {
        "jobs_per_s": rate,
        "cores": {r: round(c, 2) for r, c in role_cores.items()},
        "cores_total": round(sum(role_cores.values()), 2),
        "machines": {
            r: math.ceil(c / a.cores_per_machine) if c > 0 else 0 for r, c in role_cores.items()
        },
        "postgres": {
            "transactions_per_s": round(tps),
            "share_of_primary_tps": round(tps / a.pg_max_tps, 3),
            "wal_mb_per_s": round(wal_mb_s, 2),
            "share_of_primary_wal": round(wal_mb_s / a.pg_max_wal_mb_s, 3),
            "primaries_needed": math.ceil(max(tps / a.pg_max_tps, wal_mb_s / a.pg_max_wal_mb_s)),
        },
        "temporal": {
            "history_events_per_s": round(events_s),
            "history_shards": next_power_of_two(shards),
            "actions_per_s": round(actions_s),
            "share_of_cloud_default_aps": round(actions_s / a.cloud_namespace_aps, 2),
            "actions_per_month": monthly_actions,
            "usd_per_month_tiered": round(tiered_cost(monthly_actions)),
            "beyond_published_tiers": monthly_actions > sum(m for m, _ in ACTION_TIERS) * 1e6,
        },
        "provider": {
            "calls_per_min": round(calls_s * 60),
            "tokens_per_min": round(tokens_min),
            "keys_needed": math.ceil(keys),
        },
    }


def cost_per_1000_jobs(actions_per_job: float, a: Assumptions) -> float:
    """USD of Temporal Cloud actions for 1,000 jobs at the first published tier's price."""
    return actions_per_job * 1000 * a.action_price_per_million / 1e6
