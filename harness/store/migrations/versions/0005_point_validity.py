"""points.valid and points.invalid_reason (run schema version 2): a level that does not count is kept
with its reason; levels stored before count when none of their requests failed.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("points") as batch:
        batch.add_column(sa.Column("valid", sa.Boolean(), nullable=False, server_default=sa.true()))
        batch.add_column(sa.Column("invalid_reason", sa.Text(), nullable=True))
    points = sa.table("points", sa.column("valid", sa.Boolean()), sa.column("failed", sa.Integer()),
                      sa.column("num_prompts", sa.Integer()), sa.column("invalid_reason", sa.Text()))
    op.execute(points.update().where(points.c.failed > 0).values(
        valid=False, invalid_reason=sa.literal("requests failed (recorded before validity was)")))


def downgrade() -> None:
    with op.batch_alter_table("points") as batch:
        batch.drop_column("invalid_reason")
        batch.drop_column("valid")
