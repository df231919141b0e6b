"""From the readings of one `python -m bench.capacity` run to its figures (per job, each from the
same run) and the capacity model's table; no I/O.

A reading is a dict: `t` (monotonic s), `cpu` (CPU s per role), `pg` (`transactions` and
`rollbacks`: the engine's sessions' own, from pg_stat_statements; `all_transactions`: what
`pg_stat_database` counts, which the bench's own statements are taken from; `wal_bytes`), `actions`
(the Temporal server's `action` counter per type) and `own` (the bench's own commits on the
engine's database so far). Idle rates come from two readings of the idle stack;
a run's deltas lose the idle rate over the run's settle time (CPU, transactions, WAL: the
convention of `bench/throughput.py`) or over its whole window (the server's actions: the relay's
heartbeats and the reconciler's runs go on while jobs run, and are reported as the fixed cost).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from bench.capacity_model import (
    ENGINE_ROLES,
    ROLES,
    Assumptions,
    HistoryCount,
    cost_per_1000_jobs,
    model,
)

Reading = Mapping[str, Any]


def rates(a: Reading, b: Reading) -> dict[str, Any]:
    """Per-second rates between two readings of the idle stack."""
    dt = b["t"] - a["t"]
    return {
        "seconds": dt,
        "cpu": {k: (b["cpu"][k] - a["cpu"][k]) / dt for k in a["cpu"]},
        "transactions": (b["pg"]["transactions"] - a["pg"]["transactions"] - _own(a, b)) / dt,
        "all_transactions": _all(a, b) / dt,
        "rollbacks": (b["pg"].get("rollbacks", 0) - a["pg"].get("rollbacks", 0)) / dt,
        "wal_bytes": (b["pg"]["wal_bytes"] - a["pg"]["wal_bytes"]) / dt,
        "actions": {
            k: (b["actions"].get(k, 0) - a["actions"].get(k, 0)) / dt
            for k in set(a["actions"]) | set(b["actions"])
        },
    }


def _own(a: Reading, b: Reading) -> int:
    """The bench's own statements, when `transactions` is pg_stat_database's count (older
    readings); the engine's statement count holds none of them."""
    return 0 if "all_transactions" in b["pg"] else int(b["own"] - a["own"])


def _all(a: Reading, b: Reading) -> float:
    key = "all_transactions" if "all_transactions" in b["pg"] else "transactions"
    return float(b["pg"][key] - a["pg"][key] - (b["own"] - a["own"]))


def per_job(
    a: Reading, b: Reading, idle: Mapping[str, Any], n: int, active_s: float
) -> dict[str, Any]:
    """A run's deltas per job, less the idle rates (over the settle time, or the whole window
    for the server's actions)."""
    window = b["t"] - a["t"]
    settle = max(0.0, window - active_s)
    cpu = {k: (b["cpu"][k] - a["cpu"][k] - idle["cpu"][k] * settle) / n for k in a["cpu"]}
    xacts = (
        b["pg"]["transactions"]
        - a["pg"]["transactions"]
        - _own(a, b)
        - idle["transactions"] * settle
    )
    all_xacts = _all(a, b) - idle.get("all_transactions", 0.0) * settle
    rollbacks = (
        b["pg"].get("rollbacks", 0) - a["pg"].get("rollbacks", 0) - idle["rollbacks"] * settle
    )
    wal = b["pg"]["wal_bytes"] - a["pg"]["wal_bytes"] - idle["wal_bytes"] * settle
    kinds = set(a["actions"]) | set(b["actions"])
    actions = {
        k: (b["actions"].get(k, 0) - a["actions"].get(k, 0) - idle["actions"].get(k, 0) * window)
        / n
        for k in sorted(kinds)
    }
    return {
        "window_s": window,
        "settle_s": settle,
        "cpu_ms": {k: 1000.0 * v for k, v in cpu.items()},
        "transactions": xacts / n,
        "rollbacks": rollbacks / n,  # of the transactions: read-only ones end in ROLLBACK
        # pg_stat_database's count: + the listening backends' NOTIFY reads and autovacuum.
        "all_transactions": all_xacts / n,
        "wal_bytes": wal / n,
        "server_actions": {k: v for k, v in actions.items() if abs(v) >= 0.005},
    }


def derive(
    run: Mapping[str, Any],
    jobs: HistoryCount,
    system: HistoryCount,
    a: Assumptions,
    rates_: tuple[float, ...] = (100.0, 1000.0),
) -> dict[str, Any]:
    """The per-job figures and the model at each rate. `run` holds `n` (jobs), `jobs_per_s`,
    `per_job` (from `per_job`), `provider_calls` and `tokens` (totals of the run), and from the
    idle probe `system_window_s` (its seconds, over which `system` was counted) and
    `idle_actions_per_s` (the server's counter)."""
    n = run["n"]
    sampled = max(1, jobs.histories)
    # The system workflows' fixed cost, from the idle probe: events from their histories,
    # actions from the server's counter when it has one (it sees the relay's heartbeats, which
    # no history shows), else from the histories.
    probe = run["system_window_s"]
    idle_actions = sum(run.get("idle_actions_per_s", {}).values())
    system_actions_s = idle_actions or system.total_actions / probe
    figures = {
        "cpu_ms": {r: run["per_job"]["cpu_ms"].get(r, 0.0) for r in ROLES},
        "transactions": run["per_job"]["transactions"],
        "rollbacks": run["per_job"].get("rollbacks", 0.0),
        "all_transactions": run["per_job"].get("all_transactions"),
        "wal_bytes": run["per_job"]["wal_bytes"],
        "history_events": jobs.events / sampled,
        "actions": jobs.total_actions / sampled,
        "actions_by_kind": {k: v / sampled for k, v in sorted(jobs.actions.items())},
        "event_types": {k: v / sampled for k, v in sorted(jobs.event_types.items())},
        "provider_calls": run["provider_calls"] / n,
        "tokens": run["tokens"] / n,
        # A fixed cost per second, shown per job at the run's own rate too.
        "system_events_per_s": system.events / probe,
        "system_actions_per_s": system_actions_s,
        "system_history_actions_per_s": system.total_actions / probe,
        "system_events_per_job": system.events / probe / run["jobs_per_s"],
        "system_actions_per_job": system_actions_s / run["jobs_per_s"],
        "system_actions_by_kind": dict(sorted(system.actions.items())),
    }
    # A worker's CPU per job of its own queue (the mix's per-job figure above is per job of any
    # queue, the one the model multiplies by the total rate).
    figures["cpu_ms_per_own_job"] = {
        q: figures["cpu_ms"][q] * n / run[q] for q in ("interactive", "background") if run.get(q)
    }
    model_in = dict(figures)
    model_in["tokens"] = run.get("tokens_override") or figures["tokens"]
    return {
        "per_job": figures,
        "engine_cpu_ms_per_job": sum(figures["cpu_ms"][r] for r in ENGINE_ROLES),
        "total_cpu_ms_per_job": sum(figures["cpu_ms"].values()),
        "cost_per_1000_jobs_usd": cost_per_1000_jobs(figures["actions"], a),
        "cost_per_1000_jobs_with_system_usd": cost_per_1000_jobs(
            figures["actions"] + figures["system_actions_per_job"], a
        ),
        "model": {f"{r:g}": model(model_in, r, a) for r in rates_},
        "assumptions": asdict(a),
    }


def render(res: Mapping[str, Any]) -> str:
    """The markdown tables docs/benchmarks.md shows: per-job figures, then the model."""
    d, run = res["derived"], res["run"]
    f = d["per_job"]
    lines = [
        f"jobs: {run['n']} ({run['interactive']} synthetic on ai-interactive, "
        f"{run['background']} {run['background_type']} on ai-background), {run['users']} users, "
        f"{run['succeeded']} succeeded, {run['jobs_per_s']:.1f} jobs/s; load average "
        f"{res['load_start']:.1f} → {res['load_end']:.1f}",
        "",
        "| per job | value |",
        "|---|---:|",
    ]
    own = f["cpu_ms_per_own_job"]
    for r in ROLES:
        mine = f" ({own[r]:.1f} per job of its queue)" if r in own else ""
        lines.append(f"| CPU ms, {r} | {f['cpu_ms'][r]:.2f}{mine} |")
    lines += [
        f"| CPU ms, engine processes / all | {d['engine_cpu_ms_per_job']:.1f} / "
        f"{d['total_cpu_ms_per_job']:.1f} |",
        f"| PostgreSQL transactions (of them rollbacks) | {f['transactions']:.2f} "
        f"({f['rollbacks']:.2f}) |",
        *(
            [
                "| PostgreSQL transactions, all (pg_stat_database: + the listening backends' "
                f"NOTIFY reads, autovacuum) | {f['all_transactions']:.2f} |"
            ]
            if f.get("all_transactions") is not None
            else []
        ),
        f"| PostgreSQL WAL bytes | {f['wal_bytes']:,.0f} |",
        f"| Temporal history events (job workflow) | {f['history_events']:.1f} |",
        f"| Temporal Cloud actions (job workflow, from its history) | {f['actions']:.2f} |",
        f"| system workflows (idle stack): history events/h, actions/h | "
        f"{f['system_events_per_s'] * 3600:,.0f} / {f['system_actions_per_s'] * 3600:,.0f} |",
        f"| system workflows' actions per job at this run's rate | "
        f"{f['system_actions_per_job']:.3f} |",
        f"| server `action` metric, per job (idle rate subtracted) | "
        f"{sum(res['run']['per_job']['server_actions'].values()):.2f} |",
        f"| provider calls / tokens | {f['provider_calls']:.2f} / {f['tokens']:.0f} |",
        f"| Temporal Cloud USD per 1,000 jobs (first tier) | {d['cost_per_1000_jobs_usd']:.3f} |",
        "",
        *_model_table(d),
    ]
    return "\n".join(lines)


def _model_table(d: Mapping[str, Any]) -> list[str]:
    rates_ = list(d["model"])
    head = "| at jobs/s | " + " | ".join(rates_) + " |"
    rows = [head, "|---|" + "---:|" * len(rates_)]

    def row(label: str, get: Any) -> None:
        rows.append(f"| {label} | " + " | ".join(str(get(d["model"][r])) for r in rates_) + " |")

    a = d["assumptions"]
    for r in ROLES:
        row(f"cores, {r} (at {a['utilisation']:.0%})", lambda m, r=r: m["cores"][r])
    row("cores, all roles", lambda m: m["cores_total"])
    row("PostgreSQL transactions/s", lambda m: f"{m['postgres']['transactions_per_s']:,}")
    row("PostgreSQL WAL MB/s", lambda m: m["postgres"]["wal_mb_per_s"])
    row("PostgreSQL primaries", lambda m: m["postgres"]["primaries_needed"])
    row("Temporal history events/s", lambda m: f"{m['temporal']['history_events_per_s']:,}")
    row("Temporal history shards", lambda m: m["temporal"]["history_shards"])
    row("Temporal actions/s", lambda m: f"{m['temporal']['actions_per_s']:,}")
    row("Temporal Cloud USD/month", lambda m: f"{m['temporal']['usd_per_month_tiered']:,}")
    row("provider keys", lambda m: m["provider"]["keys_needed"])
    return rows
