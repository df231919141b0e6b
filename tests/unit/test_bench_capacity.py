"""The capacity bench's arithmetic (`bench/capacity_model.py`, `bench/capacity_report.py`)
without a stack: Temporal Cloud actions counted from a hand-built history by the rules of the
docs page, the server metric's text parsed, the tiered price, and the model's cores, database
load, shards and provider keys from per-job figures."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from bench.capacity_model import (
    ROLES,
    Assumptions,
    HistoryCount,
    cores,
    cost_per_1000_jobs,
    count_history,
    metric_by,
    model,
    next_power_of_two,
    parse_prometheus,
    tiered_cost,
)
from bench.capacity_report import derive, per_job, rates, render

T0 = datetime(2026, 12, 4, 12, 0, 0)


def _event(kind: str, eid: int, *, at: datetime = T0, **attrs: Any) -> HistoryEvent:
    e = HistoryEvent(event_id=eid, event_type=EventType.Value(f"EVENT_TYPE_{kind}"))
    e.event_time.FromDatetime(at)
    for field_name, values in attrs.items():
        target = getattr(e, field_name)
        for k, v in values.items():
            if isinstance(v, dict):
                for kk, vv in v.items():
                    getattr(target, k).indexed_fields[kk].CopyFrom(vv)
            elif k == "metering":
                target.metering_metadata.nonfirst_local_activity_execution_attempts = v
            else:
                setattr(target, k, v)
    return e


def _marker(eid: int, name: str, task: int) -> HistoryEvent:
    e = _event("MARKER_RECORDED", eid)
    e.marker_recorded_event_attributes.marker_name = name
    e.marker_recorded_event_attributes.workflow_task_completed_event_id = task
    return e


def _sa(*names: str) -> dict[str, dict[str, Payload]]:
    return {"search_attributes": {n: Payload(data=b'"x"') for n in names}}


def _history() -> list[HistoryEvent]:
    """A job-like history: start, a workflow task recording two local activities and a patch
    marker, an activity retried once, a timer, a signal, two upserts (one only the change
    version), a child start, a workflow task with one local retry."""
    return [
        _event("WORKFLOW_EXECUTION_STARTED", 1),
        _event("WORKFLOW_TASK_SCHEDULED", 2),
        _event("WORKFLOW_TASK_STARTED", 3),
        _event("WORKFLOW_TASK_COMPLETED", 4),
        _marker(5, "core_patch", 0),
        _marker(6, "core_local_activity", 4),
        _marker(7, "core_local_activity", 4),
        _event("ACTIVITY_TASK_SCHEDULED", 8),
        _event("ACTIVITY_TASK_STARTED", 9, activity_task_started_event_attributes={"attempt": 2}),
        _event("ACTIVITY_TASK_COMPLETED", 10),
        _event("TIMER_STARTED", 11),
        _event("WORKFLOW_EXECUTION_SIGNALED", 12),
        _event(
            "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES",
            13,
            upsert_workflow_search_attributes_event_attributes=_sa("LifecycleStatus"),
        ),
        _event(
            "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES",
            14,
            upsert_workflow_search_attributes_event_attributes=_sa("TemporalChangeVersion"),
        ),
        _event("START_CHILD_WORKFLOW_EXECUTION_INITIATED", 15),
        _event(
            "WORKFLOW_TASK_COMPLETED",
            16,
            workflow_task_completed_event_attributes={"metering": 1},
            at=T0 + timedelta(seconds=10),
        ),
        _event("WORKFLOW_EXECUTION_COMPLETED", 17, at=T0 + timedelta(seconds=10)),
    ]


def test_actions_follow_the_cloud_rules_one_count_each() -> None:
    c = count_history(_history())
    assert c.events == 17
    assert dict(c.actions) == {
        "workflow started": 1,
        "activity scheduled": 1,
        "activity retried": 1,
        # the patch marker (workflow task 0 here) and both local-activity markers of task 4
        "version markers": 1,
        "local activities (one per workflow task)": 1,
        "timer started": 1,
        "signal": 1,
        "search attributes upserted": 1,
        "child workflow started": 2,
        "local activity retried": 1,
    }
    assert c.total_actions == 11
    assert c.event_types["marker_recorded"] == 3


def test_a_scheduled_run_adds_the_schedules_two_actions() -> None:
    started = _event("WORKFLOW_EXECUTION_STARTED", 1)
    sas = started.workflow_execution_started_event_attributes.search_attributes
    sas.indexed_fields["TemporalScheduledById"].CopyFrom(Payload(data=b'"ai-system:reconciler"'))
    c = count_history([started, _event("ACTIVITY_TASK_SCHEDULED", 2)])
    assert dict(c.actions) == {
        "workflow started": 1,
        "schedule (two per scheduled run)": 2,
        "activity scheduled": 1,
    }


def test_a_window_keeps_only_its_events() -> None:
    c = count_history(_history(), since=T0 + timedelta(seconds=5), until=T0 + timedelta(hours=1))
    assert c.events == 2
    assert dict(c.actions) == {"local activity retried": 1}
    total = HistoryCount()
    total.add(c)
    total.add(count_history(_history()))
    assert (total.histories, total.events, total.total_actions) == (2, 19, 12)


def test_the_server_action_metric_is_parsed_per_type() -> None:
    text = "\n".join(
        [
            "# HELP action action",
            "# TYPE action counter",
            'action{action_type="start_workflow",namespace="default"} 12',
            'action{action_type="schedule_activity",namespace="default"} 7',
            'action_total{action_type="start_workflow",namespace="other"} 3',
            'actions_other{action_type="x"} 99',
            "action 1e0",
        ]
    )
    samples = parse_prometheus(text, "action")
    assert len(samples) == 4
    assert metric_by(samples, "action_type", {"namespace": "default"}) == {
        "start_workflow": 12,
        "schedule_activity": 7,
    }
    assert metric_by(samples, "action_type")["start_workflow"] == 15


def test_the_tiered_price_matches_the_docs_example_and_the_model_arithmetic() -> None:
    # The pricing page's example: 11.25M actions on the Business plan cost $525.
    assert tiered_cost(11.25e6) == pytest.approx(525.0)
    assert tiered_cost(300e6) == pytest.approx(250 + 225 + 400 + 1050 + 1500 + 2500 + 2500)
    assert cost_per_1000_jobs(12.0, Assumptions()) == pytest.approx(0.6)
    assert cores(30.0, 100.0, 0.6) == pytest.approx(5.0)
    assert [next_power_of_two(x) for x in (0.3, 1, 3, 64, 65)] == [1, 1, 4, 64, 128]
    figures = {
        "cpu_ms": {"api": 3.0, "interactive": 30.0, "postgres": 6.0, "temporal": 24.0},
        "transactions": 5.0,
        "wal_bytes": 4000.0,
        "history_events": 30.0,
        "actions": 8.0,
        "provider_calls": 1.0,
        "tokens": 1200.0,
        "system_events_per_s": 0.5,
        "system_actions_per_s": 0.25,
    }
    m = model(figures, 100.0, Assumptions())
    assert m["cores"]["interactive"] == pytest.approx(5.0)
    assert m["cores"]["background"] == 0.0
    assert m["machines"]["interactive"] == 1
    assert m["postgres"]["transactions_per_s"] == 500
    assert m["postgres"]["wal_mb_per_s"] == pytest.approx(0.4)
    assert m["temporal"]["history_events_per_s"] == 3000  # 3000.5 rounded
    assert m["temporal"]["history_shards"] == 32  # 30.005 shards at 100 events/s each
    assert m["temporal"]["actions_per_s"] == 800
    # 100 calls/s = 6,000 rpm over 500 rpm per key; 7.2M tokens/min over 1M tpm
    assert m["provider"]["keys_needed"] == 12


def _reading(t: float, cpu: float, xacts: int, wal: int, actions: int, own: int) -> dict[str, Any]:
    return {
        "t": t,
        "cpu": dict.fromkeys(ROLES, cpu),
        "pg": {"transactions": xacts, "rollbacks": xacts // 4, "wal_bytes": wal},
        "actions": {"start_workflow": actions},
        "own": own,
    }


def test_per_job_subtracts_the_bench_and_the_idle_stack() -> None:
    idle = rates(_reading(0, 0.0, 0, 0, 0, 0), _reading(10, 0.1, 20, 1000, 10, 10))
    assert idle["transactions"] == pytest.approx(1.0)  # 20 commits, 10 of them the bench's
    a, b = _reading(100, 1.0, 1000, 10_000, 100, 50), _reading(130, 4.0, 2600, 410_000, 330, 150)
    pj = per_job(a, b, idle, n=100, active_s=20)
    assert pj["settle_s"] == pytest.approx(10.0)
    assert pj["cpu_ms"]["api"] == pytest.approx((3.0 - 0.01 * 10) / 100 * 1000)
    assert pj["transactions"] == pytest.approx((1600 - 100 - 10) / 100)
    assert pj["rollbacks"] == pytest.approx((650 - 250 - 0.5 * 10) / 100)
    assert pj["wal_bytes"] == pytest.approx((400_000 - 100 * 10) / 100)
    assert pj["server_actions"]["start_workflow"] == pytest.approx((230 - 1.0 * 30) / 100)
    jobs = count_history(_history())
    run = {
        "n": 100,
        "jobs_per_s": 5.0,
        "per_job": pj,
        "provider_calls": 100,
        "tokens": 5000,
        "interactive": 80,
        "background": 20,
        "system_window_s": 30.0,
        "idle_actions_per_s": {"grpc_RecordActivityTaskHeartbeat": 0.5},
    }
    system = count_history(_history()[:1])  # one workflow started in the probe
    d = derive(run, jobs, system, Assumptions())
    assert d["per_job"]["system_history_actions_per_s"] == pytest.approx(1 / 30)
    # The server's counter wins: it sees the heartbeats no history shows.
    assert d["per_job"]["system_actions_per_s"] == pytest.approx(0.5)
    assert d["per_job"]["system_actions_per_job"] == pytest.approx(0.1)
    assert d["per_job"]["actions"] == 11
    assert d["per_job"]["cpu_ms_per_own_job"]["background"] == pytest.approx(29.0 * 5)
    assert d["cost_per_1000_jobs_usd"] == pytest.approx(0.55)
    assert set(d["model"]) == {"100", "1000"}
    res = {
        "derived": d,
        "run": {
            **run,
            "background_type": "weak_point_analysis",
            "users": 8,
            "succeeded": 100,
        },
        "load_start": 1.0,
        "load_end": 2.0,
    }
    table = render(res)
    assert "| PostgreSQL transactions (of them rollbacks) | 14.90 (3.95) |" in table
    assert "| Temporal history shards |" in table


def test_the_flags_default_to_the_documented_assumptions() -> None:
    from bench.capacity import assumptions, parse_args

    args = parse_args([])
    assert (args.jobs, args.users, args.background_share, args.idle_seconds) == (300, 8, 0.2, 35.0)
    assert assumptions(args) == Assumptions()
    assert assumptions(parse_args(["--pg-max-tps", "20000"])).pg_max_tps == 20_000
