"""runs.profile: the profiled pass of a run (--profile-level): its concurrency and requests, the server's
trace path and kernel-time summary (k2bench profile-diff reads it), or why the server gave none. NULL for
runs without one.

A plain ADD COLUMN (nullable, no default): no table rebuild on SQLite.

Revision ID: 0013
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("profile", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:  # SQLite before 3.35 cannot drop a column in place
        batch.drop_column("profile")
