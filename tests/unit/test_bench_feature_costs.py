"""The feature-cost bench's arithmetic: each row against its own reference, and its table."""

from __future__ import annotations

from typing import Any

from bench.feature_costs import deltas, medians, table
from bench.feature_rows import rows


def _row(name: str, commits: float, rollbacks: float, reference: str | None) -> dict[str, Any]:
    return {
        "feature": name,
        "commits_per_job": commits,
        "rollbacks_per_job": rollbacks,
        "reference": reference,
    }


def test_each_row_is_compared_with_its_own_reference() -> None:
    out = deltas(
        [
            _row("plain", 4.0, 2.0, None),
            _row("deadline", 4.5, 2.0, "plain"),
            _row("flashcards", 5.0, 2.0, None),
            _row("result reuse", 4.0, 3.0, "flashcards"),
        ]
    )
    by = {r["feature"]: r["delta_per_job"] for r in out}
    assert by["plain"] is None and by["flashcards"] is None
    assert by["deadline"] == 0.5
    assert by["result reuse"] == 0.0  # one commit fewer, one rollback more


def test_table_shows_references_deltas_and_borrowed_rows() -> None:
    text = table(
        deltas(
            [
                _row("plain", 4.0, 2.0, None),
                _row("ttlSeconds", 4.25, 2.0, "plain"),
                _row("flashcards", 5.0, 2.0, None),
                _row("off-peak tier", 5.5, 2.5, "flashcards"),
            ]
        )
    )
    lines = text.splitlines()
    assert lines[0].startswith("| feature | COMMITs per job | ROLLBACKs per job | Δ")
    assert "| plain | 4.00 | 2.00 | reference |" in lines
    assert "| ttlSeconds | 4.25 | 2.00 | +0.25 |" in lines
    assert "| off-peak tier | 5.50 | 2.50 | +1.00 (vs flashcards) |" in lines
    assert any(line.startswith("| streamed items") for line in lines)
    assert all(line.count("|") == 5 for line in lines)


def test_every_reference_a_row_names_is_a_row_of_the_same_stack() -> None:
    known = {r.name: r for r in rows()}
    for r in known.values():
        if r.reference is not None:
            assert known[r.reference].reference is None
            assert known[r.reference].stack in ("default", r.stack)


def test_a_row_is_the_median_of_its_repetitions() -> None:
    runs = [{**_row("plain", c, 2.0, None), "rep": i} for i, c in enumerate((4.6, 4.4, 4.5))] + [
        {**_row("deadline", 4.7, r, "plain"), "rep": 0} for r in (2.0,)
    ]
    out = deltas(medians(runs))
    assert [r["feature"] for r in out] == ["plain", "deadline"]
    plain, deadline = out
    assert plain["commits_per_job"] == 4.5
    assert plain["totals_per_job"] == [6.6, 6.4, 6.5]
    assert len(plain["runs"]) == 3
    assert round(deadline["delta_per_job"], 3) == 0.2
