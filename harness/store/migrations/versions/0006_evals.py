"""evals: accuracy evaluations of a run (task, metric, value, stderr, n, concurrency, per-item scores).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "evals",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("task", sa.String(64), nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("stderr", sa.Float(), nullable=True),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("items", sa.JSON(), nullable=True),
    )
    op.create_index("ix_evals_run_id", "evals", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_evals_run_id", table_name="evals")
    op.drop_table("evals")
