"""runs.heartbeat_at: when the writing sweep last said it was alive, so that a reader on any host can
tell a dead sweep's `running` run from a live one. NULL for runs written before (judged as before).

A plain ADD COLUMN (nullable, no default): no table rebuild on SQLite.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("heartbeat_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:  # SQLite before 3.35 cannot drop a column in place
        batch.drop_column("heartbeat_at")
