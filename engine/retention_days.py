"""RETENTION_DAYS: how many days each kind of bookkeeping row is kept (docs/operations.md
"Retention"), one JSON object of days per kind merged over the defaults below. A job's private
data has its own setting, DATA_RETENTION_DAYS.

The nine settings it replaced are not read: a process refuses to start while one of them is
set (`removed_setting_problem`), so an operator who shortened a retention for privacy never
runs on the default without knowing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

# Days per kind; what each kind is and why its default is what it is: docs/operations.md.
DEFAULT_RETENTION_DAYS: dict[str, int] = {
    "usage": 400,  # usage rows: a year of billing and more
    "outbox": 7,  # published outbox rows
    "outbox_dead": 30,  # `dead` and `failed` outbox rows
    "provider_limit": 7,  # idle provider rate-limit buckets
    "provider_gate": 7,  # ended provider pauses, breakers and probes
    "provider_lease": 1,  # expired provider call leases
    "revoked_key": 90,  # revoked provider keys
    "webhook": 7,  # delivered and dead webhook deliveries
    "admin_audit": 365,  # admin audit entries
}

# The settings that held these before, each named after its kind; and DATA_RETENTION_DAYS's
# older name.
_REPLACED: dict[str, str] = {
    **{f"{kind.upper()}_RETENTION_DAYS": "RETENTION_DAYS" for kind in DEFAULT_RETENTION_DAYS},
    "SNAPSHOT_TTL_DAYS": "DATA_RETENTION_DAYS",
}


def parse_retention_days(value: Any) -> dict[str, int]:
    """RETENTION_DAYS (a JSON object, or a mapping when built in code) merged over the
    defaults. Raises ValueError naming RETENTION_DAYS and the entry for anything but known
    kinds with whole, positive numbers of days."""
    if value is None or value == "":
        return dict(DEFAULT_RETENTION_DAYS)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError("RETENTION_DAYS: not valid JSON (want {kind: days})") from None
    if not isinstance(value, Mapping):
        raise ValueError("RETENTION_DAYS: want a JSON object of days per kind")
    merged = dict(DEFAULT_RETENTION_DAYS)
    for kind, days in value.items():
        if kind not in DEFAULT_RETENTION_DAYS:
            raise ValueError(
                f"RETENTION_DAYS: unknown kind {str(kind)[:40]!r} "
                f"(known: {', '.join(DEFAULT_RETENTION_DAYS)})"
            )
        if isinstance(days, bool) or not isinstance(days, int) or days < 1:
            raise ValueError(
                f"RETENTION_DAYS: {kind} must be a whole number of days, at least 1 "
                f"(got {str(days)[:20]!r})"
            )
        merged[kind] = days
    return merged


def removed_setting_problem(names: Iterable[str]) -> str | None:
    """One line naming what replaced each removed retention setting among `names` (the
    environment's variable names; an empty variable counts as unset, as for every setting),
    or None."""
    found = sorted({n.upper() for n in names} & _REPLACED.keys())
    if not found:
        return None
    wanted = sorted({_REPLACED[n] for n in found})
    kinds = [n.removesuffix("_RETENTION_DAYS").lower() for n in found]
    example = ", ".join(f'"{k}": <days>' for k in kinds if k in DEFAULT_RETENTION_DAYS)
    hint = f" (e.g. RETENTION_DAYS='{{{example}}}')" if example else ""
    return (
        f"{', '.join(found)} {'is' if len(found) == 1 else 'are'} no longer read: "
        f"set {' and '.join(wanted)} instead{hint}"
    )
