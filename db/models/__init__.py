"""SQLAlchemy models of the tables (docs/contracts.md, "Tables"), one module per concern.

Importing this package registers every table on `Base.metadata`: migrations, the schema check
and key rotation read the whole of it. The Alembic migrations are the schema; a test keeps the
two equal.
"""

from __future__ import annotations

from db.models import (
    admin,
    batch,
    budgets,
    console,
    flow,
    jobs,
    limits,
    projected,
    provider,
    schedules,
    stream,
    trust,
    usage,
    webhooks,
)
from db.models.base import ENCRYPTED, TS, Base, encrypted

__all__ = [
    "ENCRYPTED",
    "TS",
    "Base",
    "admin",
    "batch",
    "budgets",
    "console",
    "encrypted",
    "flow",
    "jobs",
    "limits",
    "projected",
    "provider",
    "schedules",
    "stream",
    "trust",
    "usage",
    "webhooks",
]
