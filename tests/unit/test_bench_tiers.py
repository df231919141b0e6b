"""bench/tiers.py's arithmetic: each phase's figures over standard's, and the off-peak window
it opens around the run."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from bench.tiers import open_window, ratios
from engine.offpeak import in_window, parse_windows


def test_each_phase_is_a_ratio_to_standard_and_a_zero_baseline_has_none() -> None:
    rows = {
        "standard": {
            "cost_per_1000_jobs_usd": "0.4200",
            "worker_cpu_ms_per_job": 50.0,
            "commits_per_job": 4.0,
            "wall_s": 2.0,
        },
        "batch": {
            "cost_per_1000_jobs_usd": "0.2100",
            "worker_cpu_ms_per_job": 60.0,
            "commits_per_job": 6.0,
            "wall_s": 5.0,
        },
    }
    out = ratios(rows)
    assert out["standard"] == dict.fromkeys(out["standard"], 1.0)
    assert out["batch"] == {
        "cost_per_1000_jobs_usd": 0.5,
        "worker_cpu_ms_per_job": 1.2,
        "commits_per_job": 1.5,
        "wall_s": 2.5,
    }
    rows["standard"]["commits_per_job"] = 0
    assert ratios(rows)["batch"]["commits_per_job"] is None


def test_the_window_it_opens_is_open_now_for_the_mock_s_provider() -> None:
    now = datetime.now(UTC)
    text = open_window(now, 0.5)
    windows = parse_windows(text)
    assert set(json.loads(text)) == {"openai_compatible"}
    assert in_window(now, windows["openai_compatible"]) is not None
