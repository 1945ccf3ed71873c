"""SLO figures: runs.slo (the SLO a sweep was given) and, per level, attainment with its interval, the
requests that met it and the goodput (k2bench.harness.measure.slo). NULL for levels written before, or
without an SLO; `k2bench show --slo` computes them from the stored requests after the fact.

Plain ADD COLUMNs (nullable, no default): no table rebuild on SQLite.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

POINT_COLUMNS = (("slo_attainment", sa.Float()), ("slo_attainment_low", sa.Float()),
                 ("slo_attainment_high", sa.Float()), ("slo_met", sa.Integer()), ("goodput_rps", sa.Float()),
                 ("goodput_per_gpu", sa.Float()))


def upgrade() -> None:
    op.add_column("runs", sa.Column("slo", sa.String(255), nullable=True))
    for name, kind in POINT_COLUMNS:
        op.add_column("points", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("points") as batch:  # SQLite before 3.35 cannot drop a column in place
        for name, _ in POINT_COLUMNS:
            batch.drop_column(name)
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("slo")
