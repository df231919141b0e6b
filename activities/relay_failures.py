"""How one outbox row's dispatch failed (activities/relay.py): the kinds the relay settles a row
by, and which of Temporal's answers mean "unreachable" rather than "refused"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from temporalio.service import RPCError, RPCStatusCode

FailureKind = Literal["unavailable", "retry", "malformed"]
# Transient conditions of the server, not the row's fault: it did not answer (UNAVAILABLE,
# DEADLINE_EXCEEDED, CANCELLED) or it is shedding load (RESOURCE_EXHAUSTED: a rate limit or a
# busy history shard). The row backs off and the claim does not count as an attempt, so a
# loaded or absent Temporal never parks a job's enqueue; the relay as a whole slows down too.
UNREACHABLE = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.CANCELLED,
        RPCStatusCode.RESOURCE_EXHAUSTED,
    }
)


@dataclass(frozen=True)
class DispatchFailure:
    kind: FailureKind
    error: str


def rpc_failure(exc: RPCError) -> DispatchFailure:
    """Temporal's refusal or silence as a row's outcome: unreachable (uncounted) or retry."""
    kind: FailureKind = "unavailable" if exc.status in UNREACHABLE else "retry"
    return DispatchFailure(kind, f"RPCError {exc.status.name if exc.status else ''}")
