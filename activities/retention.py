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
    """Days each kind of row is kept (the settings named `*_RETENTION_DAYS`)."""

    data_days: int = 30  # DATA_RETENTION_DAYS: a terminal job's private data
    outbox_days: int = 7  # OUTBOX_RETENTION_DAYS: published outbox rows
    audit_days: int = 365  # ADMIN_AUDIT_RETENTION_DAYS
    usage_days: int = 400  # USAGE_RETENTION_DAYS: usage rows (not the month's rollup)
    provider_limit_days: int = 7  # PROVIDER_LIMIT_RETENTION_DAYS: idle rate-limit buckets
    provider_gate_days: int = 7  # PROVIDER_GATE_RETENTION_DAYS: closed provider gates
    lease_days: int = 1  # PROVIDER_LEASE_RETENTION_DAYS: expired call leases
    outbox_parked_days: int = 30  # OUTBOX_DEAD_RETENTION_DAYS: dead and failed outbox rows
    revoked_key_days: int = 90  # REVOKED_KEY_RETENTION_DAYS: revoked credentials


def retention_config(settings: Settings) -> RetentionConfig:
    return RetentionConfig(
        data_days=settings.data_retention_days,
        outbox_days=settings.outbox_retention_days,
        audit_days=settings.admin_audit_retention_days,
        usage_days=settings.usage_retention_days,
        provider_limit_days=settings.provider_limit_retention_days,
        provider_gate_days=settings.provider_gate_retention_days,
        lease_days=settings.provider_lease_retention_days,
        outbox_parked_days=settings.outbox_dead_retention_days,
        revoked_key_days=settings.revoked_key_retention_days,
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
