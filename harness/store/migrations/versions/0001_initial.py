"""Initial schema: runs, points (one per run, concurrency and trial), requests (raw stamps),
change_points.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("commit", sa.String(64), nullable=True),
        sa.Column("branch", sa.String(255), nullable=True),
        sa.Column("engine", sa.String(255), nullable=False),
        sa.Column("engine_version", sa.String(255), nullable=True),
        sa.Column("engine_flags", sa.JSON(), nullable=True),
        sa.Column("server_command", sa.Text(), nullable=True),
        sa.Column("model", sa.String(512), nullable=False),
        sa.Column("precision", sa.String(64), nullable=True),
        sa.Column("hardware", sa.String(255), nullable=True),
        sa.Column("num_gpus", sa.Integer(), nullable=False),
        sa.Column("tp", sa.Integer(), nullable=True),
        sa.Column("workload", sa.String(255), nullable=True),
        sa.Column("isl", sa.Integer(), nullable=True),
        sa.Column("osl", sa.Integer(), nullable=True),
        sa.Column("range_ratio", sa.Float(), nullable=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=True),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("client", sa.JSON(), nullable=True),
        sa.Column("notes", sa.Text(), nullable=True),
        sa.Column("extra", sa.JSON(), nullable=True),
        sa.Column("writer_host", sa.String(255), nullable=True),
        sa.Column("writer_pid", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_runs_fingerprint", "runs", ["fingerprint"])
    op.create_index("ix_runs_status", "runs", ["status"])
    op.create_index("ix_runs_started_at", "runs", ["started_at"])

    op.create_table(
        "points",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("trial", sa.Integer(), nullable=False),
        sa.Column("num_prompts", sa.Integer(), nullable=False),
        sa.Column("completed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("osl_mismatches", sa.Integer(), nullable=False),
        sa.Column("errors", sa.JSON(), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("input_tokens", sa.BigInteger(), nullable=True),
        sa.Column("output_tokens", sa.BigInteger(), nullable=True),
        sa.Column("tput_per_gpu", sa.Float(), nullable=True),
        sa.Column("output_tput_per_gpu", sa.Float(), nullable=True),
        sa.Column("input_tput_per_gpu", sa.Float(), nullable=True),
        sa.Column("interactivity_median", sa.Float(), nullable=True),
        sa.Column("interactivity_p90", sa.Float(), nullable=True),
        sa.Column("interactivity_p99", sa.Float(), nullable=True),
        sa.Column("extra", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=True),
        sa.Column("ttft_ms_mean", sa.Float(), nullable=True),
        sa.Column("ttft_ms_median", sa.Float(), nullable=True),
        sa.Column("ttft_ms_std", sa.Float(), nullable=True),
        sa.Column("ttft_ms_p90", sa.Float(), nullable=True),
        sa.Column("ttft_ms_p99", sa.Float(), nullable=True),
        sa.Column("ttft_ms_p99_9", sa.Float(), nullable=True),
        sa.Column("tpot_ms_mean", sa.Float(), nullable=True),
        sa.Column("tpot_ms_median", sa.Float(), nullable=True),
        sa.Column("tpot_ms_std", sa.Float(), nullable=True),
        sa.Column("tpot_ms_p90", sa.Float(), nullable=True),
        sa.Column("tpot_ms_p99", sa.Float(), nullable=True),
        sa.Column("tpot_ms_p99_9", sa.Float(), nullable=True),
        sa.Column("itl_ms_mean", sa.Float(), nullable=True),
        sa.Column("itl_ms_median", sa.Float(), nullable=True),
        sa.Column("itl_ms_std", sa.Float(), nullable=True),
        sa.Column("itl_ms_p90", sa.Float(), nullable=True),
        sa.Column("itl_ms_p99", sa.Float(), nullable=True),
        sa.Column("itl_ms_p99_9", sa.Float(), nullable=True),
        sa.Column("e2el_ms_mean", sa.Float(), nullable=True),
        sa.Column("e2el_ms_median", sa.Float(), nullable=True),
        sa.Column("e2el_ms_std", sa.Float(), nullable=True),
        sa.Column("e2el_ms_p90", sa.Float(), nullable=True),
        sa.Column("e2el_ms_p99", sa.Float(), nullable=True),
        sa.Column("e2el_ms_p99_9", sa.Float(), nullable=True),
        sa.UniqueConstraint("run_id", "concurrency", "trial", name="uq_points_level"),
    )
    op.create_index("ix_points_run_id", "points", ["run_id"])

    op.create_table(
        "requests",
        sa.Column("id", BIG_ID, primary_key=True),
        sa.Column("point_id", sa.Integer(), sa.ForeignKey("points.id", ondelete="CASCADE"), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("trial", sa.Integer(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("warmup", sa.Boolean(), nullable=False),
        sa.Column("requested_input_tokens", sa.Integer(), nullable=False),
        sa.Column("requested_output_tokens", sa.Integer(), nullable=False),
        sa.Column("send_ns", sa.BigInteger(), nullable=False),
        sa.Column("end_ns", sa.BigInteger(), nullable=True),
        sa.Column("n_tokens", sa.Integer(), nullable=False),
        sa.Column("token_deltas", sa.LargeBinary(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=True),
        sa.Column("success", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_index("ix_requests_point", "requests", ["point_id", "idx"])
    op.create_index("ix_requests_run_id", "requests", ["run_id"])

    op.create_table(
        "change_points",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("branch", sa.String(255), nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("commit", sa.String(64), nullable=True),
        sa.Column("detected_at", sa.DateTime(), nullable=True),
        sa.Column("mean_before", sa.Float(), nullable=True),
        sa.Column("mean_after", sa.Float(), nullable=True),
        sa.Column("rel_change", sa.Float(), nullable=True),
        sa.Column("p_value", sa.Float(), nullable=True),
    )
    op.create_index("ix_change_points_series", "change_points", ["fingerprint", "branch"])


def downgrade() -> None:
    op.drop_table("change_points")
    op.drop_table("requests")
    op.drop_table("points")
    op.drop_table("runs")
