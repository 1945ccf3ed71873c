"""Workloads beyond random prompts: runs.workload_def (the definition and its seed, fingerprinted),
points.prefix_hit_rate / prefix_hit_source / turns (hit rate and per-turn figures of a level), and
requests.cached_tokens / session / turn. All nullable, no default: plain ADD COLUMNs, no table rebuild.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

COLUMNS = {
    "runs": [sa.Column("workload_def", sa.JSON(), nullable=True)],
    "points": [sa.Column("prefix_hit_rate", sa.Float(), nullable=True),
               sa.Column("prefix_hit_source", sa.String(64), nullable=True),
               sa.Column("turns", sa.JSON(), nullable=True)],
    "requests": [sa.Column("cached_tokens", sa.Integer(), nullable=True),
                 sa.Column("session", sa.Integer(), nullable=True),
                 sa.Column("turn", sa.Integer(), nullable=True)],
}


def upgrade() -> None:
    for table, columns in COLUMNS.items():
        for column in columns:
            op.add_column(table, column)


def downgrade() -> None:
    for table, columns in COLUMNS.items():
        with op.batch_alter_table(table) as batch:  # SQLite before 3.35 cannot drop a column in place
            for column in columns:
                batch.drop_column(column.name)
