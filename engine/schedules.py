"""Recurring jobs: the pure part of a schedule (its spec, its next fire, its ids and payloads).

A schedule fires either every `interval_s` seconds or on a five-field cron expression read in
an IANA time zone. The next fire is computed here, in Python, so that `nextRunAt` is known the
moment a create answers (before the Temporal schedule exists) and matches what Temporal fires:
an interval is aligned on the Unix epoch, as Temporal's `ScheduleIntervalSpec` without offset
is, and a cron expression is restricted to the syntax both Temporal and `cronsim` read the same
way (numbers, names, `*`, ranges, lists and steps; no `L`, `W`, `#`, `?` or `@` macros).
No I/O.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError

OVERLAPS: tuple[str, ...] = ("skip", "buffer_one", "allow_all")
SCHEDULE_RUN_WORKFLOW = "ScheduledRun"
SCHEDULE_RUN_ACTIVITY = "schedule_run"
SCHEDULE_JOB_ENDED = "schedule_job_ended"
# The task queue of `ScheduledRun` (plus the deployment's suffix): served by the `ai-system`
# process with slots of its own, so a backlog of runs never waits in front of the relay or the
# reconciler.
SCHEDULES_QUEUE = "ai-schedules"
# The webhook/outbox event of a run that the create path refused.
RUN_REFUSED = "ai.schedule.run_refused"
# A schedule's changes, as outbox events the relay dispatches (`aggregateId`: the scheduleId):
# make Temporal's schedule match the row (or delete it), and start one run now.
SYNC_EVENT = "ai.schedule.sync"
TRIGGER_EVENT = "ai.schedule.trigger"
SCHEDULE_EVENTS = frozenset({SYNC_EVENT, TRIGGER_EVENT})
# Each field: a list of items, each `*` or a number/name or a range, with an optional step.
_ITEM = r"(\*|[0-9]{1,2}|[A-Za-z]{3})(-([0-9]{1,2}|[A-Za-z]{3}))?(/[0-9]{1,2})?"
_FIELD = re.compile(rf"^{_ITEM}(,{_ITEM})*$")


class InvalidSpec(ValueError):
    """The spec cannot be scheduled; the message is safe to show to the schedule's owner, and
    `field` names the request's field at fault (None: the fields together)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Spec:
    """When a schedule fires. Exactly one of `interval_s` and `cron` is set."""

    interval_s: int | None
    cron: str | None
    timezone: str = "UTC"
    start_at: datetime | None = None
    end_at: datetime | None = None


@dataclass(frozen=True)
class ScheduledRunInput:
    """The payload of a `ScheduledRun` workflow: ids and a time only (no input, no owner).
    `manual_at` is set for a run started by `/trigger` (it runs even while the schedule is
    paused); a fire of the Temporal schedule leaves it None and uses its scheduled time."""

    schedule_id: str
    manual_at: str | None = None


@dataclass(frozen=True)
class ScheduleRunRequest:
    """The run activity's input: which schedule, the run's time (RFC 3339), manual or not."""

    schedule_id: str
    scheduled_at: str
    manual: bool = False


@dataclass(frozen=True)
class ScheduledRunResult:
    schedule_id: str
    scheduled_at: str
    outcome: str  # "created" | "refused" | "skipped"
    job_id: str | None = None
    error_code: str | None = None


def temporal_schedule_id(schedule_id: object, suffix: str = "") -> str:
    """The Temporal schedule's id: contains the scheduleId, so the UI finds it by that id."""
    return f"aijobs-schedule:{schedule_id}{suffix}"


def run_workflow_id(schedule_id: object, scheduled_at: datetime, suffix: str = "") -> str:
    """A manual run's workflow id (a fire's is Temporal's own: the action id and the time)."""
    return f"aijobs-schedule:{schedule_id}{suffix}:trigger:{iso(scheduled_at)}"


def idempotency_key(schedule_id: object, scheduled_at: datetime) -> str:
    """The create's key: one job per (schedule, scheduled time), however often a fire runs."""
    return f"schedule:{schedule_id}:{iso(scheduled_at)}"


def iso(value: datetime) -> str:
    """RFC 3339 in UTC with a `Z`, to the microsecond only when it has one."""
    text = value.astimezone(UTC).isoformat()
    return text.replace("+00:00", "Z")


def check_timezone(name: str) -> ZoneInfo:
    if name not in _zones():
        raise InvalidSpec("timezone must be an IANA time zone name, e.g. Europe/Paris.", "timezone")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidSpec("timezone must be an IANA time zone name.", "timezone") from exc


_ZONES: set[str] = set()


def _zones() -> set[str]:
    if not _ZONES:
        _ZONES.update(available_timezones())
        _ZONES.add("UTC")
    return _ZONES


def check_cron(expr: str) -> str:
    """The expression, normalised to single spaces; `InvalidSpec` unless it has five fields
    in the common syntax and `cronsim` accepts it."""
    fields = expr.split()
    if len(fields) != 5 or not all(_FIELD.match(f) for f in fields):
        raise InvalidSpec(
            "cron must have five fields (minute hour day-of-month month day-of-week) of numbers,"
            " names, *, ranges, lists and steps.",
            "cron",
        )
    if any(int(n) > 6 for n in re.findall(r"[0-9]+", fields[4].split("/")[0])):
        # Sunday is 0: 7 is read as Sunday by some cron dialects and refused by others.
        raise InvalidSpec("cron day-of-week is 0-6 (0 is Sunday) or SUN-SAT.", "cron")
    text = " ".join(fields)
    try:
        CronSim(text, datetime(2000, 1, 1, tzinfo=UTC))
    except (CronSimError, ValueError, KeyError) as exc:
        raise InvalidSpec("cron is not a valid expression.", "cron") from exc
    return text


def check_spec(spec: Spec, *, min_interval_s: int) -> Spec:
    """The spec as stored (cron normalised), or `InvalidSpec`."""
    if (spec.interval_s is None) == (spec.cron is None):
        raise InvalidSpec("Give exactly one of intervalSeconds and cron.")
    if spec.interval_s is not None and spec.interval_s < min_interval_s:
        raise InvalidSpec(f"intervalSeconds must be at least {min_interval_s}.", "intervalSeconds")
    check_timezone(spec.timezone)
    if spec.start_at and spec.end_at and spec.end_at <= spec.start_at:
        raise InvalidSpec("endAt must be after startAt.", "endAt")
    cron = check_cron(spec.cron) if spec.cron is not None else None
    return Spec(spec.interval_s, cron, spec.timezone, spec.start_at, spec.end_at)


def next_fire(spec: Spec, now: datetime) -> datetime | None:
    """The first fire strictly after `now` (and at or after `start_at`), None past `end_at`."""
    after = now
    if spec.start_at is not None and spec.start_at > now:
        after = spec.start_at - timedelta(microseconds=1)
    if spec.interval_s is not None:
        every = spec.interval_s
        seconds = math.floor(after.timestamp() / every) * every + every
        fire = datetime.fromtimestamp(seconds, UTC)
    else:
        assert spec.cron is not None
        tz = ZoneInfo(spec.timezone)
        local = after.astimezone(tz).replace(microsecond=0)
        try:
            fire = next(iter(CronSim(spec.cron, local))).astimezone(UTC)
        except StopIteration:
            return None
    if spec.end_at is not None and fire > spec.end_at:
        return None
    return fire
