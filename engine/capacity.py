"""AI_CAPACITY_RESERVE: the share of every limited provider key kept for a class of calls while
one of its calls waits (docs/limits.md, "Classes and reserves").

A call's class is its job type's queue: `interactive` (`ai-interactive`) or `background`
(`ai-background`). The reserve itself is applied by db/limit_classes.py; this module only
parses the setting (pure, so the settings can refuse a malformed one at start).
"""

from __future__ import annotations

import json

JOB_CLASSES = ("interactive", "background")
RESERVE_SETTING = "AI_CAPACITY_RESERVE"


def job_class(queue_name: str) -> str:
    """The class of a job's calls: its queue's (`ai-interactive` -> `interactive`)."""
    return queue_name.removeprefix("ai-")


def parse_capacity_reserve(raw_text: str) -> dict[str, float]:
    """AI_CAPACITY_RESERVE: a JSON object of class (`interactive`, `background`) -> its share
    of every limited key's concurrency, rpm and tpm, a number in [0, 1); the shares add up to
    less than 1. Empty or `{}`: no reserve. Raises ValueError naming the setting and the
    entry."""
    if not raw_text.strip():
        return {}
    try:
        raw = json.loads(raw_text)
    except ValueError:
        raise ValueError(f"{RESERVE_SETTING}: not valid JSON") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{RESERVE_SETTING}: want a JSON object of class -> share")
    out: dict[str, float] = {}
    for name, share in raw.items():
        if name not in JOB_CLASSES:
            raise ValueError(
                f"{RESERVE_SETTING}: unknown class {str(name)[:40]!r} "
                f"(want one of {', '.join(JOB_CLASSES)})"
            )
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share < 1:
            raise ValueError(f"{RESERVE_SETTING}[{name!r}]: want a share in [0, 1)")
        out[name] = float(share)
    if sum(out.values()) >= 1:
        raise ValueError(f"{RESERVE_SETTING}: the shares must add up to less than 1")
    return out
