"""points.num_prompts, completed and failed may be NULL (schema version 2): results imported from a tool
that does not count requests (InferenceX) keep them missing instead of invented.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

COUNTS = ("num_prompts", "completed", "failed")


def upgrade() -> None:
    with op.batch_alter_table("points") as batch:
        for name in COUNTS:
            batch.alter_column(name, existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    with op.batch_alter_table("points") as batch:
        for name in COUNTS:
            batch.alter_column(name, existing_type=sa.Integer(), nullable=False)
