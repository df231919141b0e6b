"""The markdown table `python -m bench` prints at the end of a run (`render`): one function per
figure's rows, each reading only its figure from the results and adding an error row when the
figure failed, so a missing figure never hides the others.
"""

from __future__ import annotations

import math
from typing import Any

from bench.stats import ratio
from bench.wrk import WRK_THREADS

HEAD = ("#", "Figure", "Engine", "Baseline", "Ratio", "Target", "Met")


def num(x: Any, fmt: str = ".1f") -> str:
    """A number for the table; "—" when there is none."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return format(x, fmt)


def met(x: Any) -> str:
    """A target's cell: met, not met (in bold) or not measured."""
    return "—" if x is None else ("yes" if x else "**no**")


class Rows(list[tuple[str, ...]]):
    """The table's rows: number, figure, engine, baseline, ratio, target, met."""

    def row(
        self,
        num_: str,
        figure: str,
        engine: str,
        baseline: str = "—",
        ratio_: str = "—",
        target: str = "—",
        met_: str = "—",
    ) -> None:
        self.append((num_, figure, engine, baseline, ratio_, target, met_))

    def error_row(self, num_: str, figure: str) -> None:
        self.row(num_, figure, "error")


def render(data: dict[str, Any]) -> str:
    """The markdown table of the figures (1 to 6), then the scale and fairness figures and a
    line on how it was measured; errors last."""
    p = data["parameters"]
    figs = data["figures"]
    failed = {e["where"] for e in data["errors"]}
    rows: list[tuple[str, ...]] = []
    for section in (
        _throughput_rows,
        _latency_rows,
        _relay_rows,
        _api_rows,
        _postgres_rows,
        _scaling_rows,
        _tracing_rows,
        _idle_rows,
    ):
        rows += section(p, figs, failed)
    rows += _rss_rows(data)
    lines: list[str] = []
    if rows:
        lines += ["| " + " | ".join(HEAD) + " |", "|" + "|".join("---" for _ in HEAD) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    if "scale" in figs:
        from bench.scale import render as render_scale

        lines += render_scale(figs["scale"])
    elif "scale" in failed:
        lines += ["", "Scale (7): error (see below)"]
    if "rows" in figs.get("fairness", {}):
        from bench.fairness import render as render_fairness

        lines += render_fairness(figs["fairness"])
    elif "fairness" in failed:
        lines += ["", "Fairness (8): error (see below)"]
    m = data["machine"]
    reps = p["reps"]
    lines.append("")
    medians = (
        f"Median of {reps} repetition{'s' if reps != 1 else ''} after a warm-up"
        if set(p.get("figures", [])) - {"scale"}
        else "Scale figure only"
    )
    lines.append(
        f"{medians}{' (--quick)' if p['quick'] else ''}; {m['usable_cores']} cores "
        f"({m.get('cpu_model', '?')}), load average at start {m['loadavg_start'][0]:.2f}; "
        f"total {data.get('duration_s', 0):.0f} s. Raw repetitions: {p['output']}."
    )
    for e in data["errors"]:
        lines.append(f"ERROR in {e['where']}: {e['error']}")
    return "\n".join(lines)


def _throughput_rows(p: dict[str, Any], figs: dict[str, Any], failed: set[str]) -> Rows:
    """The jobs/s of figure 1 against each bare side, then its CPU per job."""
    rows = Rows()
    tp = figs.get("throughput", {})
    if "engine" in tp:
        for side, label, key in (
            ("shape", "bare 5-stage shape: 4 local + 1 regular no-op activities", "shape_"),
            ("baseline", "bare workflow + one no-op activity", ""),
        ):
            if side not in tp:
                continue
            rows.row(
                "1",
                f"End-to-end throughput, N={p['jobs']} synthetic jobs (jobs/s) vs {label}",
                num(tp["engine"]["median_jobs_per_s"]),
                num(tp[side]["median_jobs_per_s"]),
                f"{num(tp[f'{key}ratio'], '.2f')} (per rep "
                f"{num(tp.get(f'{key}ratio_per_rep_median'), '.2f')})",
                "≥ " + tp[f"{key}target"].removeprefix(">= "),
                met(tp[f"{key}met"]),
            )
    if "median_own_cpu_s_per_job" in tp.get("engine", {}):
        te = tp["engine"]
        ec = te["median_cpu_s_per_job"]
        for side, label, key, worker in (
            ("shape", "the bare 5-stage worker", "shape_", "shape_worker"),
            ("baseline", "the bare one-activity worker", "", "baseline_worker"),
        ):
            if side not in tp:
                continue
            tb = tp[side]
            rows.row(
                "1",
                f"CPU s/job during 1, in ms: engine worker + relay vs {label}; "
                "total = with the Temporal server and PostgreSQL",
                f"{1e3 * te['median_own_cpu_s_per_job']:.2f} (worker "
                f"{1e3 * ec['engine_worker']:.2f} + relay {1e3 * ec['relay']:.2f}); total "
                f"{1e3 * te['median_total_cpu_s_per_job']:.2f}",
                f"{1e3 * tb['median_cpu_s_per_job'][worker]:.2f} (worker); total "
                f"{1e3 * tb['median_total_cpu_s_per_job']:.2f}",
                f"{num(tp[f'{key}cpu_ratio'], '.2f')} "
                f"(total {num(tp[f'{key}cpu_total_ratio'], '.2f')})",
                "≤ " + tp["cpu_target"].removeprefix("<= ") if side == "shape" else "—",
                met(tp["cpu_met"]) if side == "shape" else "—",
            )
    elif "throughput" in failed:
        rows.error_row("1", "End-to-end throughput")
    return rows


def _latency_rows(p: dict[str, Any], figs: dict[str, Any], failed: set[str]) -> Rows:
    """Figure 2: create to succeeded at a fixed offered load."""
    rows = Rows()
    lat = figs.get("latency", {})
    if "median_p50_ms" in lat:
        rows.row(
            "2",
            f"Latency create→succeeded at {p['rate']:g} jobs/s x {p['duration']:g} s, "
            "p50 / p95 / p99 (ms)",
            " / ".join(num(lat[f"median_{k}_ms"]) for k in ("p50", "p95", "p99")),
        )
    elif "latency" in failed:
        rows.error_row("2", "Latency at fixed load")
    return rows


def _relay_rows(p: dict[str, Any], figs: dict[str, Any], failed: set[str]) -> Rows:
    """Figure 3: the relay's commit-to-start latency against a direct start."""
    rows = Rows()
    rl = figs.get("relay", {})
    for prefix in ("", "loaded_"):
        if f"{prefix}relay" not in rl:
            continue
        n = rl.get(f"{prefix}background", 0)
        load = f", while {n} other jobs run" if n else ""
        rows.row(
            "3",
            f"Relay: outbox commit → WorkflowExecutionStarted{load}, p50 (ms)",
            num(rl[f"{prefix}relay"]["median_p50_ms"]),
            num(rl[f"{prefix}direct"]["median_p50_ms"]) + " (direct start_workflow RPC)",
            f"{num(rl[f'{prefix}p50_ratio'], '.2f')} (Δ {rl[f'{prefix}p50_delta_ms']:+.1f} ms)",
            "≤ direct + 5 ms",
            met(rl[f"{prefix}p50_met"]),
        )
        rows.row(
            "3",
            f"Relay: outbox commit → WorkflowExecutionStarted{load}, p99 (ms)",
            num(rl[f"{prefix}relay"]["median_p99_ms"]),
            num(rl[f"{prefix}direct"]["median_p99_ms"]),
            num(rl[f"{prefix}p99_ratio"], ".2f"),
            "≤ 2x",
            met(rl[f"{prefix}p99_met"]),
        )
    if "relay" not in rl and "relay" in failed:
        rows.error_row("3", "Relay latency")
    return rows


def _api_rows(p: dict[str, Any], figs: dict[str, Any], failed: set[str]) -> Rows:
    """Figure 4: each real route against its bare twin, then its round trips."""
    rows = Rows()
    api = figs.get("api", {})
    if "get" in api:
        c = p["api_connections"]
        client = api.get("client", "python")
        if client == "wrk":
            gen = f"wrk -t{min(WRK_THREADS, c)} -c{c}"
        else:
            gen = f"{client}, {c} connections"
        keys = " with distinct Idempotency-Keys" if p.get("api_idempotency_keys") else ""

        def cpu(x: dict[str, Any]) -> str:
            return (
                f"client CPU {num(x.get('median_client_cpu_pct'), '.0f')} %, "
                f"server {num(x.get('median_server_cpu_pct'), '.0f')} %"
            )

        for route, bare, label, blabel, target in (
            ("get", "get_bare", "GET /api/ai/jobs/{id}", "bare PK SELECT", "≥ 0.8"),
            ("post", "post_bare", f"POST /api/ai/jobs{keys}", "bare 3 INSERTs", "≥ 0.6"),
        ):
            rows.row(
                "4",
                f"{label}, {gen} (req/s)",
                num(api[route]["median_req_per_s"], ".0f") + f" ({cpu(api[route])})",
                num(api[bare]["median_req_per_s"], ".0f") + f" ({blabel}; {cpu(api[bare])})",
                num(api[f"{route}_ratio"], ".2f"),
                target,
                met(api[f"{route}_met"]),
            )
            rows.row(
                "4",
                f"{label} p50 / p99 latency (ms)",
                f"{num(api[route].get('median_p50_ms'))} / {num(api[route]['median_p99_ms'])}",
                f"{num(api[bare].get('median_p50_ms'))} / {num(api[bare]['median_p99_ms'])}",
                num(ratio(api[route]["median_p99_ms"], api[bare]["median_p99_ms"]), ".2f")
                + " (p99)",
            )
        st = api.get("statements")
        for route, bare, label in (("post", "post_bare", "POST"), ("get", "get_bare", "GET")):
            if not st or route not in st:
                continue
            per = st[route]["per_request"]
            rows.row(
                "4",
                f"{label} round trips to PostgreSQL per request (SQLAlchemy events, in-process)",
                f"{st[route]['round_trips']:g}: "
                + ", ".join(f"{k} x{v:g}" for k, v in per.items()),
                f"{st[bare]['round_trips']:g} (bare)",
                num(ratio(st[route]["round_trips"], st[bare]["round_trips"]), ".2f"),
            )
    elif "api" in failed:
        rows.error_row("4", "API overhead")
    return rows


def _postgres_rows(p: dict[str, Any], figs: dict[str, Any], failed: set[str]) -> Rows:
    """Figure 5: commits per job, and the engine's load against pgbench."""
    rows = Rows()
    pg = figs.get("postgres", {})
    if "commits_per_job" in pg:
        rows.row(
            "5",
            "PostgreSQL commits per job: COMMITs of the engine's transactions during 1 "
            "(pg_stat_statements) ÷ jobs",
            num(pg["commits_per_job"], ".2f"),
            target="≤ " + pg["commits_target"].removeprefix("<= "),
            met_=met(pg["commits_met"]),
        )
    if "all_xacts_per_job" in pg:
        rows.row(
            "5",
            "PostgreSQL transactions per job, all (pg_stat_database Δ ÷ jobs: + the read-only "
            "stages' rollbacks, listeners' NOTIFY reads, autovacuum; flushed late)",
            f"{num(pg['all_xacts_per_job'], '.2f')} (rollbacks "
            f"{num(pg.get('rollbacks_per_job'), '.2f')})",
        )
    if "load_pct" in pg:
        rows.row(
            "5",
            "PostgreSQL load: engine commits/s during 1 ÷ pgbench create-tx tps",
            num(pg["engine_commits_per_s"], ".0f") + " commits/s",
            num(pg["pgbench"]["median_tps"], ".0f") + " tps (pgbench)",
            num(pg["load_pct"], ".1f") + " %",
            "≤ 25 %",
            met(pg["load_met"]),
        )
    elif "postgres" in failed:
        rows.error_row("5", "PostgreSQL load (pgbench)")
    return rows


def _scaling_rows(p: dict[str, Any], figs: dict[str, Any], failed: set[str]) -> Rows:
    """Figure 6: two workers against one, and the CPU split of each."""
    rows = Rows()
    sc = figs.get("scaling", {})
    if "ratio" in sc:
        rows.row(
            "6",
            "Throughput with 2 worker processes (jobs/s)",
            num(sc["two_workers"]["median_jobs_per_s"]),
            num(sc["one_worker_median_jobs_per_s"]) + " (1 worker)",
            num(sc["ratio"], ".2f"),
            "≥ 1.4",
            met(sc["met"]),
        )
    for key, label in (("one_worker", "1 worker"), ("two_workers", "2 workers")):
        split = sc.get(f"{key}_split")
        if split is None:
            continue
        ms = split["cpu_ms_per_job"]
        rows.row(
            "6",
            f"CPU ms/job with {label}: worker(s) / relay / Temporal / PostgreSQL (total; "
            "jobs/s per core; cores busy)",
            " / ".join(f"{ms[k]:.1f}" for k in ("engine_worker", "relay", "temporal", "postgres"))
            + f" ({split['total_cpu_ms_per_job']:.1f}; {split['jobs_per_s_per_core']:.1f}; "
            f"{split['cores_busy']:.2f})",
        )
    if "ratio" not in sc and "scaling" in failed:
        rows.error_row("6", "Worker scaling")
    return rows


def _tracing_rows(p: dict[str, Any], figs: dict[str, Any], failed: set[str]) -> Rows:
    """Figure 9: the tracing figure's own rows (`bench/tracing.py`)."""
    rows = Rows()
    if "tracing" in figs:
        from bench.tracing import render as render_tracing

        rows += render_tracing(figs["tracing"])
    elif "tracing" in failed:
        rows.error_row("9", "Tracing cost")
    return rows


def _idle_rows(p: dict[str, Any], figs: dict[str, Any], failed: set[str]) -> Rows:
    """Figure 10: an idle dev stack's PostgreSQL transactions a minute, and its busiest
    statements."""
    rows = Rows()
    idle = figs.get("idle", {})
    if "per_minute" in idle:
        top = ", ".join(
            f"{s['per_minute']:.1f} {s['query'][:40]}" for s in idle["statements_per_minute"][:3]
        )
        rows.row(
            "10",
            f"Idle `aijobs dev` (4 processes, nothing queued): PostgreSQL transactions a minute "
            f"(pg_stat_database, {idle['window_s']:.0f} s, {idle['settle_s']:.0f} s after start)",
            num(idle["per_minute"]) + (f" (busiest: {top})" if top else ""),
            target="≤ " + idle["target"].removeprefix("<= "),
            met_=met(idle["met"]),
        )
    elif "idle" in failed:
        rows.error_row("10", "Idle cost")
    return rows


def _rss_rows(data: dict[str, Any]) -> Rows:
    """The peak RSS of each kind of process, when any was read."""
    rows = Rows()
    rss = data.get("peak_rss_mb", {})
    if any(rss.values()):
        rows.row(
            "-",
            "Peak RSS (VmHWM): engine worker / API / relay (MB)",
            " / ".join(num(rss.get(k), ".0f") for k in ("engine_worker", "api", "relay")),
            num(rss.get("baseline_worker"), ".0f")
            + " (one-activity worker) / "
            + num(rss.get("shape_worker"), ".0f")
            + " (5-stage worker)",
        )
    return rows
