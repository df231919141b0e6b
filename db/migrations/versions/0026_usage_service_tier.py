"""usage service tier: the tier each provider call was priced at

- `ai_usage_log.service_tier`: 'standard', 'batch' (the call went through the provider's Batch
  API, priced at the model's batch price) or 'offpeak' (made inside the provider's discount
  window, priced at the window's price); every older row was a standard call. A constant
  default adds the column without rewriting the table; the CHECK is added NOT VALID and
  validated separately, which holds a lighter lock on a large table.

Revision ID: 0026
Revises: 0025
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0026'
down_revision: str | None = '0025'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CK = 'ck_ai_usage_log_service_tier'


def upgrade() -> None:
    op.add_column(
        'ai_usage_log',
        sa.Column('service_tier', sa.Text(), server_default=sa.text("'standard'"), nullable=False),
    )
    op.execute(
        f"ALTER TABLE ai_usage_log ADD CONSTRAINT {CK} "
        "CHECK (service_tier IN ('standard','batch','offpeak')) NOT VALID"
    )
    op.execute(f"ALTER TABLE ai_usage_log VALIDATE CONSTRAINT {CK}")


def downgrade() -> None:
    op.drop_constraint(CK, 'ai_usage_log', type_='check')
    op.drop_column('ai_usage_log', 'service_tier')
