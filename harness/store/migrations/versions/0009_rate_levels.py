"""Rate levels (open loop) beside closed-loop ones: a level's kind (mode, rate), its achieved rate, send lag
and queue time; each request's intended send time and queue time; the run's arrival schedule settings;
the level kind of a change point.

Levels and requests stored before are closed-loop levels (mode 'closed', rate NULL). The unique key of a
level grows from (run_id, concurrency, trial) to (run_id, mode, rate, concurrency, trial), so a run may
hold a rate level and a closed level of the same concurrency; on SQLite that rebuilds the points table.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

POINT_FIGURES = ("achieved_rate", "send_lag_p50_ms", "send_lag_p99_ms", "queue_p50_ms", "queue_p99_ms")


def upgrade() -> None:
    op.add_column("runs", sa.Column("arrival", sa.JSON(), nullable=True))
    op.add_column("change_points", sa.Column("mode", sa.String(16), nullable=True))  # null: a closed level
    op.add_column("change_points", sa.Column("rate", sa.Float(), nullable=True))
    with op.batch_alter_table("points") as batch:
        batch.add_column(sa.Column("mode", sa.String(16), nullable=False, server_default="closed"))
        batch.add_column(sa.Column("rate", sa.Float(), nullable=True))
        for name in POINT_FIGURES:
            batch.add_column(sa.Column(name, sa.Float(), nullable=True))
        batch.drop_constraint("uq_points_level", type_="unique")
        batch.create_unique_constraint("uq_points_level", ["run_id", "mode", "rate", "concurrency", "trial"])
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("mode", sa.String(16), nullable=False, server_default="closed"))
        batch.add_column(sa.Column("rate", sa.Float(), nullable=True))
        batch.add_column(sa.Column("intended_ns", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("queue_ns", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        for name in ("queue_ns", "intended_ns", "rate", "mode"):
            batch.drop_column(name)
    with op.batch_alter_table("points") as batch:
        batch.drop_constraint("uq_points_level", type_="unique")
        batch.create_unique_constraint("uq_points_level", ["run_id", "concurrency", "trial"])
        for name in (*reversed(POINT_FIGURES), "rate", "mode"):
            batch.drop_column(name)
    with op.batch_alter_table("change_points") as batch:
        batch.drop_column("rate")
        batch.drop_column("mode")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("arrival")
