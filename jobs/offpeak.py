"""The off-peak tier's decisions, over the window arithmetic of engine/offpeak.py.

An off-peak job runs only inside its provider's discount window, at the window's price; it waits
for one `queued`, on its workflow's timer (workflows/offpeak_hold.py), until its deadline, where
its `offpeakDeadline` policy decides: `then: "standard"` runs at once at the standard price,
`then: "fail"` fails the job with OFFPEAK_DEADLINE_PASSED. So:

- at create, `check_create`: a provider without a window refuses the tier (422 naming it, never
  silently standard); the job is reserved (jobs/requests.py) at the dearest window's price
  when it can only run in a window (`then: "fail"`), at the standard price when it may run at
  it (`then: "standard"`). `deadline`: the create's own, else the policy's longest wait
  (engine/offpeak.py MAX_WAIT_S, a day) after the create, and never later;
- at RESOLVE, `hold`: what the workflow waits for (the next window's start, the deadline, the
  policy), before the job asks for a worker slot;
- at each EXECUTE attempt's start, `gate`: a window that closed meanwhile (the job waited for a
  slot, or a retry came after it) is waited for again if the deadline allows, else the policy;
- at each call's start, `call_tier`: inside a window the call is charged at the window's price
  (`tier="offpeak"`, `discount`) and its usage row says so; outside one, at the standard price.

The synthetic provider makes no paid call: it needs no window (all day, at factor 1) unless
AI_OFFPEAK_WINDOWS names it.
"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, NamedTuple

from db.jobs import JobRow, ResolveRefs
from engine.contracts import OffpeakHold
from engine.errors import ValidationFailed
from engine.offpeak import (
    DEADLINE_PASSED,
    GATE_REASON,
    Window,
    Windows,
    in_window,
    next_window,
    reserve_factor,
)
from engine.tiers import OFFPEAK, STANDARD
from jobs.gateway import Gateway
from jobs.waits import Wait

if TYPE_CHECKING:
    from jobs.policy import CreatePolicy
    from jobs.requests import CreateJobRequest
    from jobs.spec import AnyJobType

SYNTHETIC = "synthetic"
_ALL_DAY = (Window(time(0), time(0), Decimal(1)),)
# A wait EXECUTE hands back is at least this long: the workflow's timers have a 1 s floor.
_MIN_WAIT_S = 1.0
# A create's deadline may pass the longest wait by this much: a client that asks for the
# longest wait from its own clock is not refused for its latency or its clock's drift.
_DEADLINE_SLACK = timedelta(minutes=1)


class CallTier(NamedTuple):
    """The tier and factor one call is charged at, decided when it starts."""

    tier: str = STANDARD
    discount: Decimal | None = None


def windows_of(windows: Windows, provider: str) -> tuple[Window, ...]:
    """A provider's windows; the synthetic provider's, unless configured: all day."""
    if provider in windows:
        return windows[provider]
    return _ALL_DAY if provider == SYNTHETIC else ()


def reserve_discounts(windows: Windows) -> dict[str, Decimal]:
    """Each provider with a window and the dearest window's price: what an off-peak job that
    can only run inside one is reserved at (jobs/policy.py `offpeak_discounts`). The synthetic
    provider, unless configured, at factor 1 (its calls are free)."""
    factors = {p: reserve_factor(w) for p, w in windows.items()}
    out = {p: f for p, f in factors.items() if f is not None}
    return out if SYNTHETIC in windows else {SYNTHETIC: Decimal(1), **out}


def _refuse(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(message, errors=[{"loc": [field], "msg": message, "type": "value"}])


def check_create(
    req: CreateJobRequest,
    jt: AnyJobType,
    policy: CreatePolicy,
    mode: str,
    tier: str,
    now: datetime | None = None,
) -> None:
    """The off-peak checks of a create of effective `tier`: its provider has a discount window
    (else 422 `serviceTier`, naming the provider: never silently standard) and its deadline is
    within the policy's longest wait of now (else 422 `offpeakDeadline`). What it is reserved at is
    jobs/requests.py's (the window's price unless it may run at the standard one)."""
    if tier != OFFPEAK:
        return
    provider = policy.provider_for(jt, mode).name
    if policy.offpeak_discount(jt, mode) is None and provider != SYNTHETIC:
        raise _refuse(
            "serviceTier",
            f"serviceTier offpeak needs a discount window of the job's provider, and provider "
            f"{provider} has none configured (AI_OFFPEAK_WINDOWS). Use serviceTier standard.",
        )
    latest = (now or datetime.now(UTC)) + timedelta(seconds=policy.offpeak_max_wait_s)
    latest += _DEADLINE_SLACK
    if req.offpeak_deadline_at is not None and req.offpeak_deadline_at > latest:
        raise _refuse(
            "offpeakDeadline",
            f"offpeakDeadline.at may be at most {policy.offpeak_max_wait_s} s after the create",
        )


def deadline(req: CreateJobRequest, tier: str, max_wait_s: int, now: datetime) -> datetime | None:
    """An off-peak job's deadline: the create's, else `max_wait_s` after `now` (the create)."""
    if tier != OFFPEAK:
        return None
    return req.offpeak_deadline_at or now + timedelta(seconds=max_wait_s)


def hold(refs: ResolveRefs, provider: str, windows: Windows, now: datetime) -> OffpeakHold | None:
    """RESOLVE's word to the workflow on an off-peak job (None: not off-peak): the start of the
    provider's window it is in or will open next ("" when it has none), the job's deadline and
    its policy there. A job with no deadline stored has reached it."""
    if refs.service_tier != OFFPEAK:
        return None
    nxt = next_window(now, windows_of(windows, provider))
    return OffpeakHold(
        window_at=nxt.start.isoformat() if nxt is not None else "",
        deadline=(refs.offpeak_deadline_at or now).isoformat(),
        then=refs.offpeak_on_deadline or "fail",
    )


def gate(gateway: Gateway, jt: AnyJobType, row: JobRow, now: datetime) -> Wait | str | None:
    """At an attempt's start: None, the call may go (not off-peak, inside a window, or past the
    deadline with `then: "standard"`); a `Wait` until the next window or the deadline, whichever
    comes first; or the code to fail with (past the deadline with `then: "fail"`)."""
    if row.service_tier != OFFPEAK:
        return None
    provider = gateway.provider_for(jt, row.credential_mode).name
    own = windows_of(gateway.offpeak_windows, provider)
    if in_window(now, own) is not None:
        return None
    until = row.offpeak_deadline_at or now
    if now >= until:
        return None if row.offpeak_on_deadline == "standard" else DEADLINE_PASSED
    nxt = next_window(now, own)
    if nxt is not None and nxt.start < until:
        until = nxt.start
    wait_s = max((until - now).total_seconds(), _MIN_WAIT_S)
    return Wait(wait_s, GATE_REASON, provider, gateway.model_for(jt, row.credential_mode))


def call_tier(gateway: Gateway, jt: AnyJobType, row: JobRow, now: datetime) -> CallTier:
    """The tier a call starting `now` is charged at: the window's price inside one, else the
    standard price."""
    if row.service_tier != OFFPEAK:
        return CallTier()
    provider = gateway.provider_for(jt, row.credential_mode).name
    inside = in_window(now, windows_of(gateway.offpeak_windows, provider))
    return CallTier() if inside is None else CallTier(OFFPEAK, inside.price)
