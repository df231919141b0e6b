"""The console's pure parts: a jobs filter read from query parameters (the admin list's names,
empty fields ignored, values checked as the admin list checks them, times without an offset in
UTC) and the spend chart's bars (one per day of the range, scaled to the largest)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

from api.console.views import filters_of, limit_of, notice, spend_chart
from db.jobs import JobFilter


def test_a_filter_is_the_admin_lists_query_parameters() -> None:
    f = filters_of(
        [
            ("status", "failed"),
            ("jobType", ""),
            ("userId", " alice "),
            ("metadata.courseId", "C42"),
            ("createdFrom", "2026-01-02T03:04:05"),
            ("utm_source", "mail"),
            ("cursor", "abc"),
        ]
    )
    assert f.errors == []
    assert f.job_filter() == JobFilter(
        user_id="alice",
        status="failed",
        created_from=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        metadata=(("courseId", "C42"),),
    )
    assert f.query(limit=50) == (
        "status=failed&userId=alice&createdFrom=2026-01-02T03%3A04%3A05"
        "&metadata.courseId=C42&limit=50"
    )


def test_a_value_the_admin_list_refuses_is_an_error_not_an_empty_page() -> None:
    for pairs in (
        [("status", "done")],
        [("errorCode", "lower")],
        [("metadata.bad key", "x")],
        [("createdTo", "1700000000")],
        [("userId", "a\x00b")],
    ):
        f = filters_of(pairs)
        assert f.body is None and f.errors, pairs


def test_limits_and_notices_are_bounded() -> None:
    assert [limit_of(v) for v in (None, "", "7", "0", "1000", "x")] == [50, 50, 7, 1, 100, 50]
    assert notice("cancelled") and notice("<script>") is None and notice(None) is None


def test_the_chart_has_a_bar_per_day_scaled_to_the_largest() -> None:
    chart = spend_chart(
        date(2026, 1, 1), date(2026, 1, 30), {"2026-01-02": Decimal("2"), "2026-01-30": Decimal(1)}
    )
    assert len(chart.bars) == 30 and chart.top == Decimal(2)
    heights = {b.day.isoformat(): b.height for b in chart.bars}
    assert heights["2026-01-02"] == 2 * heights["2026-01-30"] > 0
    assert heights["2026-01-01"] == 0
    assert all(b.y + b.height == chart.height for b in chart.bars)
    assert max(b.x + b.width for b in chart.bars) <= chart.width
    empty = spend_chart(date(2026, 1, 1), date(2026, 1, 1), {})
    assert [b.height for b in empty.bars] == [0.0]
