"""Run Alembic migrations programmatically (`aijobs migrate`, the dev stack, the test suite)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, pool, text

from db.models import Base
from db.session import DEFAULT_APPLICATION_NAME, sqlalchemy_url

MIGRATIONS = Path(__file__).parent / "migrations"
# Serialises concurrent `aijobs migrate` runs (e.g. several containers starting at once).
_MIGRATE_LOCK_KEY = 7_304_113_001


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return cfg


def upgrade(
    url: str, revision: str = "head", *, application_name: str = DEFAULT_APPLICATION_NAME
) -> None:
    """Migrate to `revision` under the migrations' session lock (`aijobs migrate` names its
    connection `aijobs-migrate`)."""
    engine = create_engine(
        sqlalchemy_url(url),
        poolclass=pool.NullPool,
        connect_args={"application_name": application_name},
    )
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _MIGRATE_LOCK_KEY})
        try:
            cfg = alembic_config(url)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            conn.commit()
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _MIGRATE_LOCK_KEY})
            conn.commit()
    engine.dispose()


def schema_diff(url: str) -> list[Any]:
    """What autogenerate would change to make the database match the models (empty = in sync)."""
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    engine.dispose()
    return list(diff)
