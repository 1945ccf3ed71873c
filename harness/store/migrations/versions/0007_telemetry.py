"""points: energy, cost and server metrics of each level (JSON) and their flat figures for the
catalogue (J/token, tokens/J, $/Mtok, % of roofline). Schema version 2.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

JSON_COLUMNS = ("energy", "cost", "server_metrics")
FLOAT_COLUMNS = ("j_per_token", "tokens_per_j", "usd_per_mtok", "usd_per_mtok_output", "pct_roofline")


def upgrade() -> None:
    with op.batch_alter_table("points") as batch:
        for name in JSON_COLUMNS:
            batch.add_column(sa.Column(name, sa.JSON(), nullable=True))
        for name in FLOAT_COLUMNS:
            batch.add_column(sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("points") as batch:
        for name in (*FLOAT_COLUMNS, *JSON_COLUMNS):
            batch.drop_column(name)
