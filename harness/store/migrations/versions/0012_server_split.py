"""points: the server-side time split (mean, median, p99 of queue, prefill, decode and inference time,
and server TTFT) and speculative decoding's acceptance length and draft acceptance rate, per level.

Plain ADD COLUMNs (nullable, no default): no table rebuild on SQLite. NULL for levels written before.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

PHASES = ("queue", "prefill", "decode", "inference")
KEYS = ("mean", "median", "p99")
COLUMNS = ("server_ttft_ms", *(f"server_{p}_ms_{k}" for p in PHASES for k in KEYS), "spec_accept_len",
           "spec_accept_rate")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("points", sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("points") as batch:  # SQLite before 3.35 cannot drop a column in place
        for name in reversed(COLUMNS):
            batch.drop_column(name)
