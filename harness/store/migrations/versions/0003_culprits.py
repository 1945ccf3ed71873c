"""culprits: the first bad commit each bisection named, so the dashboard can mark it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "culprits",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("fingerprint", sa.String(64), nullable=True),
        sa.Column("branch", sa.String(255), nullable=True),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("good", sa.String(64), nullable=False),
        sa.Column("bad", sa.String(64), nullable=False),
        sa.Column("first_bad", sa.String(64), nullable=True),
        sa.Column("subject", sa.Text(), nullable=True),
        sa.Column("steps", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_culprits_series", "culprits", ["fingerprint", "branch"])
    op.create_index("ix_culprits_first_bad", "culprits", ["first_bad"])


def downgrade() -> None:
    op.drop_index("ix_culprits_first_bad", "culprits")
    op.drop_index("ix_culprits_series", "culprits")
    op.drop_table("culprits")
