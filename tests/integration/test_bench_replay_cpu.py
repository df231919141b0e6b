"""`python -m bench.replay_cpu` (the workflow side's CPU per run, by replay) runs its three
runners on the recorded plain history and reports a figure for each."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from bench.replay_cpu import HISTORY, VARIANTS


def test_the_replay_figure_runs_each_runner_on_the_plain_history() -> None:
    assert HISTORY.is_file()
    out = subprocess.run(
        [sys.executable, "-m", "bench.replay_cpu", "--runs", "3", "--rounds", "1"],
        cwd=Path(__file__).resolve().parents[2],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    figures = dict(re.findall(r"^(\w+)\s+CPU ms per replay: ([\d.]+)$", out, re.M))
    assert set(figures) == set(VARIANTS), out
    assert all(float(ms) > 0 for ms in figures.values()), out
