"""ORM tables. The schema itself is created by the Alembic migrations in ./migrations; a test
checks that these models and the migrated schema agree."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from k2bench.harness.metrics import INTERACTIVITY_KEYS, LATENCY_METRICS, STAT_KEYS

# SQLite only autoincrements INTEGER PRIMARY KEY; elsewhere request ids may need 64 bits.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def stat_column(metric: str, stat: str) -> str:
    """Column name of one latency statistic, e.g. ttft_ms_p99_9."""
    return f"{metric}_{stat.replace('.', '_')}"


STAT_COLUMNS = [stat_column(m, s) for m in LATENCY_METRICS for s in STAT_KEYS]
INTERACTIVITY_COLUMNS = [f"interactivity_{k}" for k in INTERACTIVITY_KEYS]


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    commit: Mapped[str | None] = mapped_column(String(64))
    branch: Mapped[str | None] = mapped_column(String(255))
    engine: Mapped[str] = mapped_column(String(255))
    engine_version: Mapped[str | None] = mapped_column(String(255))
    engine_flags: Mapped[dict | list | str | None] = mapped_column(JSON)
    server_command: Mapped[str | None] = mapped_column(Text)
    model: Mapped[str] = mapped_column(String(512))
    precision: Mapped[str | None] = mapped_column(String(64))
    hardware: Mapped[str | None] = mapped_column(String(255))
    num_gpus: Mapped[int] = mapped_column(Integer)
    tp: Mapped[int | None] = mapped_column(Integer)
    workload: Mapped[str | None] = mapped_column(String(255))
    isl: Mapped[int | None] = mapped_column(Integer)
    osl: Mapped[int | None] = mapped_column(Integer)
    range_ratio: Mapped[float | None] = mapped_column(Float)
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    tags: Mapped[dict | None] = mapped_column(JSON)
    trials: Mapped[int] = mapped_column(Integer, default=1)
    status: Mapped[str] = mapped_column(String(16), index=True)
    started_at: Mapped[datetime] = mapped_column(DateTime, index=True)  # naive UTC
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)
    client: Mapped[dict | None] = mapped_column(JSON)
    notes: Mapped[str | None] = mapped_column(Text)
    extra: Mapped[dict | None] = mapped_column(JSON)
    # Who is writing this run (not exported): lets readers tell a live sweep from a dead one.
    writer_host: Mapped[str | None] = mapped_column(String(255))
    writer_pid: Mapped[int | None] = mapped_column(Integer)
    writer_start: Mapped[int | None] = mapped_column(BigInteger)  # process start, clock ticks since boot
    updated_at: Mapped[datetime | None] = mapped_column(DateTime)


class Point(Base):
    __tablename__ = "points"
    __table_args__ = (UniqueConstraint("run_id", "concurrency", "trial", name="uq_points_level"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    concurrency: Mapped[int] = mapped_column(Integer)
    trial: Mapped[int] = mapped_column(Integer, default=0)
    num_prompts: Mapped[int] = mapped_column(Integer)
    completed: Mapped[int] = mapped_column(Integer)
    failed: Mapped[int] = mapped_column(Integer)
    osl_mismatches: Mapped[int] = mapped_column(Integer, default=0)
    errors: Mapped[list | None] = mapped_column(JSON)
    duration_s: Mapped[float | None] = mapped_column(Float)
    input_tokens: Mapped[int | None] = mapped_column(BigInteger)
    output_tokens: Mapped[int | None] = mapped_column(BigInteger)
    tput_per_gpu: Mapped[float | None] = mapped_column(Float)
    output_tput_per_gpu: Mapped[float | None] = mapped_column(Float)
    input_tput_per_gpu: Mapped[float | None] = mapped_column(Float)
    interactivity_median: Mapped[float | None] = mapped_column(Float)
    interactivity_p90: Mapped[float | None] = mapped_column(Float)
    interactivity_p99: Mapped[float | None] = mapped_column(Float)
    extra: Mapped[dict | None] = mapped_column(JSON)
    created_at: Mapped[datetime | None] = mapped_column(DateTime)


# One Float column per latency statistic (ttft_ms_mean ... e2el_ms_p99_9), added programmatically
# so that the list lives in one place (metrics.LATENCY_METRICS x metrics.STAT_KEYS).
for _name in STAT_COLUMNS:
    setattr(Point, _name, Column(_name, Float, nullable=True))


class Request(Base):
    """One request's raw stamps. Token arrival times are stored as a compact blob
    (see store.codec): deltas in ns, first from send_ns, then from the previous token."""

    __tablename__ = "requests"
    __table_args__ = (Index("ix_requests_point", "point_id", "idx"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    point_id: Mapped[int] = mapped_column(ForeignKey("points.id", ondelete="CASCADE"))
    run_id: Mapped[int] = mapped_column(Integer, index=True)
    concurrency: Mapped[int] = mapped_column(Integer)
    trial: Mapped[int] = mapped_column(Integer)
    idx: Mapped[int] = mapped_column(Integer)
    warmup: Mapped[bool] = mapped_column(Boolean)
    requested_input_tokens: Mapped[int] = mapped_column(Integer)
    requested_output_tokens: Mapped[int] = mapped_column(Integer)
    send_ns: Mapped[int] = mapped_column(BigInteger)
    end_ns: Mapped[int | None] = mapped_column(BigInteger)
    n_tokens: Mapped[int] = mapped_column(Integer)
    token_deltas: Mapped[bytes] = mapped_column(LargeBinary)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    output_tokens: Mapped[int | None] = mapped_column(Integer)
    success: Mapped[bool] = mapped_column(Boolean)
    error: Mapped[str | None] = mapped_column(Text)


class ChangePoint(Base):
    __tablename__ = "change_points"
    __table_args__ = (Index("ix_change_points_series", "fingerprint", "branch"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    branch: Mapped[str] = mapped_column(String(255))
    metric: Mapped[str] = mapped_column(String(64))
    concurrency: Mapped[int] = mapped_column(Integer)
    run_id: Mapped[int | None] = mapped_column(Integer)
    commit: Mapped[str | None] = mapped_column(String(64))
    detected_at: Mapped[datetime | None] = mapped_column(DateTime)
    mean_before: Mapped[float | None] = mapped_column(Float)
    mean_after: Mapped[float | None] = mapped_column(Float)
    rel_change: Mapped[float | None] = mapped_column(Float)
    p_value: Mapped[float | None] = mapped_column(Float)


class Culprit(Base):
    """What a bisection found: the first bad commit (or none) between good and bad, with its steps."""

    __tablename__ = "culprits"
    __table_args__ = (Index("ix_culprits_series", "fingerprint", "branch"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str | None] = mapped_column(String(64))
    branch: Mapped[str | None] = mapped_column(String(255))
    metric: Mapped[str] = mapped_column(String(64))
    concurrency: Mapped[int] = mapped_column(Integer)
    good: Mapped[str] = mapped_column(String(64))
    bad: Mapped[str] = mapped_column(String(64))
    first_bad: Mapped[str | None] = mapped_column(String(64), index=True)
    subject: Mapped[str | None] = mapped_column(Text)
    steps: Mapped[list | None] = mapped_column(JSON)
    created_at: Mapped[datetime | None] = mapped_column(DateTime)
