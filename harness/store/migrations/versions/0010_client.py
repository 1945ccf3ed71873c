"""points: the client's own load over each level (client JSON and its flat CPU and lag figures) and the
steady state (steady JSON with the window and one-second slices; steady throughputs, TPOT and ITL
statistics). All nullable: levels stored before were not measured this way.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

STAT_KEYS = ("mean", "median", "std", "p90", "p99", "p99_9")  # as stored: stat_column(group, key)
JSON_COLUMNS = ("client", "steady")
FLOAT_COLUMNS = ("client_cpu", "client_cpu_share", "client_lag_p99_ms", "steady_duration_s", "steady_tput_per_gpu",
                 "steady_output_tput_per_gpu",
                 *(f"{group}_{key}" for group in ("steady_tpot_ms", "steady_itl_ms") for key in STAT_KEYS))


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
