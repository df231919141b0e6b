"""The reconciler's retention phase: every kind of row the engine keeps for a while, each after
its own retention (docs/operations.md "Retention"), one bounded page of each per pass.

Each kind runs in its own transaction, so a failure of one (a lock timeout, say) rolls back
only its own page and the next pass tries again; the counts are what the pass reports
(`ReconcileResult.private_data_purged`, `snapshots_deleted`, `outbox_deleted`, and the
reconciler's log line for the rest).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from db import audit as audit_db
from db import outbox as outbox_db
from db import retention as retention_db
from db import schedules as schedules_db
from db import snapshots as snapshots_db
from db.session import SessionMaker
from engine.settings import Settings


@dataclass(frozen=True)
class RetentionConfig:
    """Days each kind of row is kept: DATA_RETENTION_DAYS for a job's private data, the kinds
    of RETENTION_DAYS (engine/retention_days.py) for the rest."""

    data_days: int = 30  # DATA_RETENTION_DAYS: a terminal job's private data
    outbox_days: int = 7  # "outbox": published outbox rows
    audit_days: int = 365  # "admin_audit": admin audit entries
    usage_days: int = 400  # "usage": usage rows (not the month's rollup)
    provider_limit_days: int = 7  # "provider_limit": idle rate-limit buckets
    provider_gate_days: int = 7  # "provider_gate": closed provider gates
    lease_days: int = 1  # "provider_lease": expired call leases
    outbox_parked_days: int = 30  # "outbox_dead": dead and failed outbox rows
    revoked_key_days: int = 90  # "revoked_key": revoked credentials


def retention_config(settings: Settings) -> RetentionConfig:
    days = settings.retention_days
    return RetentionConfig(
        data_days=settings.data_retention_days,
        outbox_days=days["outbox"],
        audit_days=days["admin_audit"],
        usage_days=days["usage"],
        provider_limit_days=days["provider_limit"],
        provider_gate_days=days["provider_gate"],
        lease_days=days["provider_lease"],
        outbox_parked_days=days["outbox_dead"],
        revoked_key_days=days["revoked_key"],
    )


Purge = Callable[[AsyncSession], Awaitable[int]]


def purges(c: RetentionConfig) -> dict[str, Purge]:
    """Each kind's purge, by the name its count is reported under, in the order they run."""
    return {
        "snapshot_deleted": lambda s: snapshots_db.delete_expired_snapshots(s),
        "private_data_purged": lambda s: retention_db.purge_private_data(
            s, retention_days=c.data_days
        ),
        "outbox_deleted": lambda s: outbox_db.delete_published(s, older_than_days=c.outbox_days),
        "audit_deleted": lambda s: audit_db.purge_older_than(s, days=c.audit_days),
        "usage_deleted": lambda s: retention_db.purge_usage(s, days=c.usage_days),
        "provider_limits_deleted": lambda s: retention_db.purge_provider_limits(
            s, days=c.provider_limit_days
        ),
        "provider_gates_deleted": lambda s: retention_db.purge_provider_gates(
            s, days=c.provider_gate_days
        ),
        "leases_deleted": lambda s: retention_db.purge_call_leases(s, days=c.lease_days),
        "outbox_parked_deleted": lambda s: retention_db.purge_parked_outbox(
            s, days=c.outbox_parked_days
        ),
        "revoked_keys_purged": lambda s: retention_db.purge_revoked_keys(
            s, days=c.revoked_key_days
        ),
        # A schedule's recorded runs, on a job's private data's clock.
        "schedule_runs_deleted": lambda s: schedules_db.purge_runs(s, days=c.data_days),
    }


async def run_retention(sm: SessionMaker, config: RetentionConfig) -> dict[str, int]:
    """One bounded page of each kind (their queries carry the limits), each in its own
    transaction; returns how many rows each removed or purged."""
    counts: dict[str, int] = {}
    for name, purge in purges(config).items():
        async with sm.begin() as s:
            counts[name] = await purge(s)
    return counts
