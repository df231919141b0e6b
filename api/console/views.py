"""What the console's pages are built from, besides the admin use cases they call: the jobs
filter as query parameters (the admin list's names), the notices an action leaves, and the
spend chart's geometry. No I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from pydantic import ValidationError

from api.routes.admin_bulk import BulkBody
from db.jobs import JobFilter

# The admin list's filters, by their query parameter names (GET /admin-api/ai/jobs).
FILTERS = (
    "status",
    "jobType",
    "userId",
    "queueName",
    "targetType",
    "targetId",
    "createdFrom",
    "createdTo",
    "errorCode",
)
METADATA = "metadata."
# A new metadata filter typed into the form: redirected to `metadata.<key>=<value>`.
NEW_KEY, NEW_VALUE = "newMetadataKey", "newMetadataValue"
DEFAULT_LIMIT, MAX_LIMIT = 50, 100

# What an action's redirect may announce (`?done=`): fixed texts, never the request's.
NOTICES = {
    "cancelled": "The job is cancelled.",
    "cancel_requested": "Cancel requested: the running job stops and ends cancelled.",
    "retried": "Retried: this is the new job.",
    "already_retried": "This job was retried before: this is that retry.",
    "requeued": "The event is requeued: the relays send it again.",
    "paused": "The schedule is paused.",
    "resumed": "The schedule is resumed.",
}


def notice(done: str | None) -> str | None:
    return NOTICES.get(done or "")


@dataclass
class Filters:
    """A jobs filter as the page's query parameters: the given (non-empty) values under the
    admin list's names, the metadata pairs, and the filter they validate to (None, with
    `errors`, when a value is one the admin list would refuse)."""

    values: dict[str, str] = field(default_factory=dict)
    metadata: list[tuple[str, str]] = field(default_factory=list)
    body: BulkBody | None = None
    errors: list[str] = field(default_factory=list)

    def pairs(self) -> list[tuple[str, str]]:
        return [*self.values.items(), *((METADATA + k, v) for k, v in self.metadata)]

    def query(self, **extra: str | int | None) -> str:
        more = [(k, str(v)) for k, v in extra.items() if v is not None]
        return urlencode([*self.pairs(), *more])

    def job_filter(self) -> JobFilter:
        assert self.body is not None
        return self.body.job_filter()


def _utc(value: datetime | None) -> datetime | None:
    """A time typed without an offset is UTC (the console shows times in UTC)."""
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def filters_of(items: Iterable[tuple[str, str]]) -> Filters:
    """The filter of a query string or a form, given as (name, value) pairs. Empty values are
    no filter; names the admin list does not take are ignored (an HTML form, not the API)."""
    f = Filters()
    for name, value in items:
        value = value.strip()
        if not value:
            continue
        if name in FILTERS:
            f.values[name] = value
        elif name.startswith(METADATA) and len(name) > len(METADATA):
            f.metadata.append((name[len(METADATA) :], value))
    raw: dict[str, Any] = dict(f.values)
    if f.metadata:
        raw["metadata"] = dict(f.metadata)
    try:
        body = BulkBody.model_validate(raw)
    except ValidationError as exc:
        f.errors = [
            f"{'.'.join(str(p) for p in e['loc']) or 'filter'}: {e['msg']}" for e in exc.errors()
        ]
        return f
    body.created_from, body.created_to = _utc(body.created_from), _utc(body.created_to)
    f.body = body
    return f


def limit_of(value: str | None) -> int:
    try:
        n = int(value or DEFAULT_LIMIT)
    except ValueError:
        return DEFAULT_LIMIT
    return min(max(n, 1), MAX_LIMIT)


# ---- the spend chart --------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    day: date
    cost: Decimal
    x: float
    y: float
    width: float
    height: float


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    bars: list[Bar]
    top: Decimal  # the largest day's spend (the chart's scale)


CHART_W, CHART_H = 1000, 160


def spend_chart(first: date, last: date, by_day: dict[str, Decimal]) -> Chart:
    """One bar per UTC day of the range (days without spend at zero), scaled to the largest."""
    days = [first + timedelta(days=i) for i in range((last - first).days + 1)]
    costs = [by_day.get(d.isoformat(), Decimal(0)) for d in days]
    top = max(costs, default=Decimal(0))
    slot = CHART_W / max(len(days), 1)
    bars = []
    for i, (day, cost) in enumerate(zip(days, costs, strict=True)):
        h = float(cost / top) * (CHART_H - 10) if top > 0 else 0.0
        bars.append(Bar(day, cost, i * slot + slot * 0.1, CHART_H - h, slot * 0.8, h))
    return Chart(CHART_W, CHART_H, bars, top)
