"""The rollout guard takes its rollout's arm locks before it counts an arm's ended jobs.

It counted first and locked only to halt: two jobs of one arm ending at once each counted the
arm's ended jobs without the other's (neither committed yet), so an arm whose last jobs ended
together could stay under `min_samples` in both counts and never be halted. Taking the arms'
locks (in name order, as the halt did) before the count makes the second guard wait for the
first transaction and count its job; the arm's state is read again after the wait.

Revision ID: 0039
Revises: 0036
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0039"
down_revision: str | None = "0036"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _previous() -> str:
    """0038's guard function, from its migration file (alembic loads these by path)."""
    spec = importlib.util.spec_from_file_location(
        "_aijobs_migration_0038", Path(__file__).with_name("0038_output_trust.py")
    )
    if spec is None or spec.loader is None:
        raise RuntimeError("migration 0038 not found")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.GUARD_FUNCTION)


_PREVIOUS = _previous()

# The arms' locks move from before the halt to before the count; the rest is 0038's guard.
_LOCK_BEFORE_HALT = (
    "    -- Every arm of the rollout locked, in one order: two halts cannot both see the other"
    " arm\n    -- still active.\n"
    "    PERFORM 1 FROM ai_rollout_arm WHERE rollout_id = r ORDER BY name FOR UPDATE;\n"
)
_CHECK = """    IF NOT FOUND OR g.state <> 'active' THEN
        RETURN;
    END IF;
"""
_LOCK_BEFORE_COUNT = (
    _CHECK
    + """    -- Every arm of the rollout locked, in one order, before the count: a guard of the same
    -- arm running at once waits here for its transaction and then counts its job, and two
    -- halts cannot both see the other arm still active.
    PERFORM 1 FROM ai_rollout_arm WHERE rollout_id = r ORDER BY name FOR UPDATE;
    SELECT state INTO g.state FROM ai_rollout_arm WHERE rollout_id = r AND name = arm_name;
    IF g.state <> 'active' THEN
        RETURN;
    END IF;
"""
)


def _serialized() -> str:
    if _PREVIOUS.count(_CHECK) != 1 or _PREVIOUS.count(_LOCK_BEFORE_HALT) != 1:
        raise RuntimeError("0038's rollout guard is not the one this migration rewrites")
    return _PREVIOUS.replace(_LOCK_BEFORE_HALT, "").replace(_CHECK, _LOCK_BEFORE_COUNT)


def upgrade() -> None:
    op.execute(_serialized())


def downgrade() -> None:
    op.execute(_PREVIOUS)
