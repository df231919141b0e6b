"""Flow control, the pure part: keyed concurrency at create (supersede, skip, debounce), the
start-by TTL, the whole-job deadline and what an operator pause matches (docs/api.md "Flow
control", docs/admin.md "Operator pauses").

Names, bounds and time arithmetic only: no I/O, importable by the workflow sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

SUPERSEDE = "supersede"
SKIP = "skip"
DEBOUNCE = "debounce"
ConcurrencyMode = Literal["supersede", "skip", "debounce"]
MODES: tuple[str, ...] = (SUPERSEDE, SKIP, DEBOUNCE)

# Bounds of a create's members.
KEY_MAX_LENGTH = 200
DELAY_MS_MIN = 100
DELAY_MS_MAX = 3_600_000
MAX_DELAY_MS_MAX = 86_400_000
TTL_S_MAX = 2_592_000  # 30 days
DEADLINE_MAX_DAYS = 30

# The codes a job ends `cancelled` with when flow control ends it.
SUPERSEDED = "SUPERSEDED"
JOB_EXPIRED = "JOB_EXPIRED"
JOB_DEADLINE_EXCEEDED = "JOB_DEADLINE_EXCEEDED"
FLOW_CODES = frozenset({SUPERSEDED, JOB_EXPIRED, JOB_DEADLINE_EXCEEDED})

# The wait reason of a call an operator pause holds (the limiter's metric label and EXECUTE's
# `gate_reason`); the provider gate's own 429 pause stays `pause`.
OPERATOR_PAUSE = "operator_pause"
# A held job looks again at least this often without a wake-up (a lost signal, a pause whose
# process died before it released its jobs), or at its pause's expiry if that comes first.
PAUSE_BACKSTOP_S = 300.0
# What the transaction that creates, deletes or expires a pause notifies (no payload of
# interest: the pause waker reads the table again).
PAUSE_CHANNEL = "aijobs_pauses"


@dataclass(frozen=True)
class Concurrency:
    """A create's `concurrency` member, as given (`delay_ms`, `max_delay_ms`: debounce only)."""

    key: str
    mode: str
    delay_ms: int | None = None
    max_delay_ms: int | None = None

    def given(self) -> dict[str, Any]:
        """The member as the client gave it (what the job's view shows): a member not given is
        not filled in."""
        out: dict[str, Any] = {"key": self.key, "mode": self.mode}
        if self.delay_ms is not None:
            out["delayMs"] = self.delay_ms
        if self.max_delay_ms is not None:
            out["maxDelayMs"] = self.max_delay_ms
        return out

    def fingerprint(self) -> str:
        """What it adds to the request an `Idempotency-Key` stands for."""
        return f"{self.key}\x1f{self.mode}\x1f{self.delay_ms}\x1f{self.max_delay_ms}"


def view(stored: dict[str, Any] | None) -> dict[str, Any] | None:
    """A stored `concurrency` as every view of a job shows it: all four members, those not given
    null."""
    if not stored:
        return None
    return {
        "key": stored.get("key"),
        "mode": stored.get("mode"),
        "delayMs": stored.get("delayMs"),
        "maxDelayMs": stored.get("maxDelayMs"),
    }


def debounce_cap(created: datetime, max_delay_ms: int) -> datetime:
    """The latest a debounce chain started at `created` may wait: its first create plus that
    create's `maxDelayMs`."""
    return created + timedelta(milliseconds=max_delay_ms)


def debounce_due(now: datetime, run_at: datetime | None, delay_ms: int, cap: datetime) -> datetime:
    """When a debounced job may first be admitted: its own delay after its create (after its
    `runAt` for a delayed job), not past its chain's cap, and never before its `runAt`."""
    base = run_at if run_at is not None and run_at > now else now
    due = min(base + timedelta(milliseconds=delay_ms), cap)
    return max(due, base)


def start_by(now: datetime, run_at: datetime | None, ttl_s: int | None) -> datetime | None:
    """A job's start-by time (`expiresAt`): its TTL counted from its create, or from its `runAt`
    for a delayed job; None without a TTL."""
    if not ttl_s:
        return None
    base = run_at if run_at is not None and run_at > now else now
    return base + timedelta(seconds=ttl_s)


def effective_ttl(requested: int | None, type_default: int | None, setting: int) -> int | None:
    """The TTL a create gets: its own (`0` turns any default off), else its job type's, else
    AI_DEFAULT_TTL_S (0: none). None: no TTL."""
    if requested is not None:
        return requested or None
    if type_default is not None:
        return type_default or None
    return setting or None


@dataclass(frozen=True)
class PauseMatch:
    """What an operator pause holds: the calls of jobs whose every given member equals the
    job's (None: any). `model` is the model of the call about to be sent."""

    job_type: str | None = None
    provider: str | None = None
    model: str | None = None
    user_id: str | None = None

    def matches(self, job_type: str, provider: str, model: str, user_id: str) -> bool:
        return (
            (self.job_type is None or self.job_type == job_type)
            and (self.provider is None or self.provider == provider)
            and (self.model is None or self.model == model)
            and (self.user_id is None or self.user_id == user_id)
        )


def held_by(
    pauses: tuple[PauseMatch, ...], job_type: str, provider: str, model: str, user_id: str
) -> bool:
    """Whether any of `pauses` holds a call of this job to this provider and model."""
    return any(p.matches(job_type, provider, model, user_id) for p in pauses)
