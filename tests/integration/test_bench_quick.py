"""`make bench ARGS="--quick"` completes: every phase produces its figure, none of them an
"error" cell, and the run exits 0. Run as a user runs it (`python -m bench --quick`, the command
`make bench` ends with, without make's wrk install step), in its own process with its own
embedded PostgreSQL and Temporal dev server, so a phase racing another phase or the engine's
background work fails here and not first on a fresh clone. About 2 minutes on the 2-core
development machine (docs/benchmarks.md); marked slow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli import FIGURES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def test_quick_bench_produces_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "quick.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    tail = (proc.stdout[-3000:], proc.stderr[-3000:])
    data = json.loads(out.read_text()) if out.exists() else {"errors": []}
    # The phases' errors first, each with its traceback's end: the table's tail alone does not
    # say which phase failed or why.
    failures = [f"{e['where']}: {e['error']}\n{e['traceback'][-1500:]}" for e in data["errors"]]
    assert failures == [], "\n\n".join(failures)
    assert proc.returncode == 0, tail
    assert set(data["figures"]) >= set(FIGURES), (sorted(data["figures"]), tail)
    # The rendered table: every figure row has a value, none says "error".
    rows = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    assert len(rows) > 2, proc.stdout
    assert not [r for r in rows if "| error |" in r], proc.stdout
    assert "ERROR in" not in proc.stdout
    tp = data["figures"]["throughput"]
    assert tp["engine"] and tp["shape"] and tp["baseline"], tp
