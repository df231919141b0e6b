"""Off-peak discount windows: when a provider charges less, and the arithmetic of waiting for it.

A provider's windows are daily UTC spans `{"start": "HH:MM", "end": "HH:MM", "price": 0.5}`
(AI_OFFPEAK_WINDOWS, one list per provider name as providers/factory.py names them); `price` is
the factor on the standard price inside the span, and an `end` at or before its `start` wraps
past midnight (16:30 to 00:30 is eight hours). UTC has no daylight saving, so a window is the
same span every day. Seconds may be given ("HH:MM:SS") for spans shorter than a minute apart.

Pure (no I/O, no clock of its own): every function takes `now`, so the job workflow's hold
(workflows/offpeak_hold.py) and EXECUTE's check (jobs/offpeak.py) decide from the same rules.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple

SETTING = "AI_OFFPEAK_WINDOWS"
# The code an off-peak job fails with when its deadline comes first (`then: "fail"`), and the
# gate reason of EXECUTE's wait for a window that closed meanwhile.
DEADLINE_PASSED = "OFFPEAK_DEADLINE_PASSED"
GATE_REASON = "offpeak"
# DeepSeek's published off-peak hours (UTC 16:30 to 00:30) at half its peak price.
DEFAULT_WINDOWS_JSON = '{"deepseek": [{"start": "16:30", "end": "00:30", "price": 0.5}]}'
# An off-peak job's default and longest deadline after its create: a day, as windows repeat
# daily, so a job created at any hour still meets its provider's next window.
MAX_WAIT_S = 86_400
_DAY = timedelta(days=1)
# The provider names a job's calls go to (providers/factory.py, and the synthetic provider): a
# window under any other name would never apply, so the setting refuses it.
PROVIDERS = ("deepseek", "openai_compatible", "synthetic")


@dataclass(frozen=True)
class Window:
    """One daily span in UTC and the price factor inside it; `end <= start` wraps midnight."""

    start: time
    end: time
    price: Decimal

    def on(self, day: date) -> OpenWindow:
        """This window as it opens on `day` (its end on the next day when it wraps)."""
        start = datetime.combine(day, self.start, UTC)
        end = datetime.combine(day, self.end, UTC)
        return OpenWindow(start, end if end > start else end + _DAY, self.price)


class OpenWindow(NamedTuple):
    """A window on one day: from `start` (inclusive) to `end` (exclusive), at `price`."""

    start: datetime
    end: datetime
    price: Decimal


Windows = Mapping[str, tuple[Window, ...]]


def _openings(now: datetime, windows: Sequence[Window]) -> list[OpenWindow]:
    """Each window as it opened yesterday, today and tomorrow: every span that can contain
    `now` or be the next one after it."""
    today = now.astimezone(UTC).date()
    days = (today - _DAY, today, today + _DAY)
    return [w.on(d) for w in windows for d in days]


def in_window(now: datetime, windows: Sequence[Window]) -> OpenWindow | None:
    """The window `now` is inside (the cheapest when several overlap), or None."""
    inside = [o for o in _openings(now, windows) if o.start <= now < o.end]
    return min(inside, key=lambda o: (o.price, o.start)) if inside else None


def next_window(now: datetime, windows: Sequence[Window]) -> OpenWindow | None:
    """The window `now` is inside, else the next one to open; None when there is none."""
    current = in_window(now, windows)
    if current is not None:
        return current
    later = [o for o in _openings(now, windows) if o.start > now]
    return min(later, key=lambda o: (o.start, o.price)) if later else None


def reserve_factor(windows: Sequence[Window]) -> Decimal | None:
    """What a job that runs only inside `windows` is reserved at: the dearest window's price
    (None: no window, the tier is not offered)."""
    return max((w.price for w in windows), default=None)


def hold_until(window_start: datetime | None, deadline: datetime) -> tuple[datetime, bool]:
    """How long an off-peak job waits: until its window opens, or until its deadline when that
    comes first (or no window is known). The flag says the deadline ends the wait, and the job's
    `offpeakDeadline` policy decides what happens there (run at the standard price, or fail)."""
    if window_start is not None and window_start <= deadline:
        return window_start, False
    return deadline, True


# ---- AI_OFFPEAK_WINDOWS ------------------------------------------------------------------


def _time(value: Any, where: str) -> time:
    parts = value.split(":") if isinstance(value, str) else []
    if len(parts) not in (2, 3) or not all(p.isdigit() and len(p) == 2 for p in parts):
        raise ValueError(f'{SETTING}: {where}: want "HH:MM" (UTC)')
    h, m, s = (int(p) for p in (*parts, "00")[:3])
    if h > 23 or m > 59 or s > 59:
        raise ValueError(f"{SETTING}: {where}: {value!r} is not a time of day")
    return time(h, m, s)


def _window(entry: Any, where: str) -> Window:
    if not isinstance(entry, dict) or set(entry) != {"start", "end", "price"}:
        raise ValueError(f"{SETTING}: {where}: want an object with start, end, price")
    start, end = _time(entry["start"], f"{where}.start"), _time(entry["end"], f"{where}.end")
    if start == end:
        raise ValueError(f"{SETTING}: {where}: start and end are the same time")
    raw = entry["price"]
    try:
        price = Decimal(str(raw)) if not isinstance(raw, bool) else Decimal("NaN")
    except InvalidOperation:
        price = Decimal("NaN")
    if not price.is_finite() or not 0 <= price <= 1:
        raise ValueError(f"{SETTING}: {where}.price: want a factor from 0 to 1 (0.5: half)")
    return Window(start, end, price)


def parse_windows(text: str) -> dict[str, tuple[Window, ...]]:
    """AI_OFFPEAK_WINDOWS: a JSON object of provider name (one of PROVIDERS) -> list of
    windows. Empty: DeepSeek's published window (DEFAULT_WINDOWS_JSON); `{}`: no provider has
    one. Raises ValueError naming the setting and the entry."""
    try:
        data = json.loads(text.strip() or DEFAULT_WINDOWS_JSON)
    except json.JSONDecodeError:
        raise ValueError(f"{SETTING}: not valid JSON") from None
    if not isinstance(data, dict):
        raise ValueError(f"{SETTING}: want an object of provider name -> list of windows")
    out: dict[str, tuple[Window, ...]] = {}
    for provider, entries in data.items():
        if provider not in PROVIDERS:
            raise ValueError(f"{SETTING}: {provider[:40]!r}: want one of {', '.join(PROVIDERS)}")
        if not isinstance(entries, list):
            raise ValueError(f"{SETTING}: {provider[:40]}: want a list of windows")
        out[provider] = tuple(_window(e, f"{provider[:40]}[{i}]") for i, e in enumerate(entries))
    return out


def default_windows() -> dict[str, tuple[Window, ...]]:
    return parse_windows(DEFAULT_WINDOWS_JSON)
