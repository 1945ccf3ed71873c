"""ORM tables: the columns of runs, points and requests come from k2bench.harness.record.schema, beside
the store's own bookkeeping columns. The database itself is created by the Alembic migrations in
./migrations; a test checks that these models and the migrated schema agree."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from k2bench.harness.record import schema

# SQLite only autoincrements INTEGER PRIMARY KEY; elsewhere request ids may need 64 bits.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def schema_columns(fields: tuple[schema.Spec, ...]) -> list[Column]:
    """The columns of a schema class's fields (k2bench.harness.record.schema), in declaration order."""
    out = []
    for s in fields:
        for name in s.columns():
            nullable = True if s.base == "stats" else s.nullable
            out.append(Column(name, s.sql, nullable=nullable, index=s.index or None))
    return out


class Base(DeclarativeBase):
    pass


class Run(Base):
    __table__ = Table(
        "runs", Base.metadata,
        Column("id", Integer, primary_key=True),
        *schema_columns(schema.RUN),
        # Who is writing this run (not exported): lets readers tell a live sweep from a dead one.
        Column("writer_host", String(255)),
        Column("writer_pid", Integer),
        Column("writer_start", BigInteger),  # process start, clock ticks since boot
        Column("updated_at", DateTime),
        Column("heartbeat_at", DateTime),  # the writer's last sign of life, on the store's clock (liveness)
    )


class Point(Base):
    __table__ = Table(
        "points", Base.metadata,
        Column("id", Integer, primary_key=True),
        Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False, index=True),
        *schema_columns(schema.POINT),
        Column("created_at", DateTime),
        # one level per kind: (mode, rate) tell a rate level from a closed one of the same concurrency; rate is
        # null for closed levels, so their uniqueness is checked by Store.add_point
        UniqueConstraint("run_id", "mode", "rate", "concurrency", "trial", name="uq_points_level"),
    )


class Request(Base):
    """One request's raw stamps. Token arrival times are stored as a compact blob
    (see store.codec): deltas in ns, first from send_ns, then from the previous token."""

    __table__ = Table(
        "requests", Base.metadata,
        Column("id", BigId, primary_key=True),
        Column("point_id", Integer, ForeignKey("points.id", ondelete="CASCADE"), nullable=False),
        Column("run_id", Integer, nullable=False, index=True),
        *schema_columns(schema.REQUEST),
        Column("n_tokens", Integer, nullable=False),
        Column("token_deltas", LargeBinary, nullable=False),  # schema field token_delta_ns
        Index("ix_requests_point", "point_id", "idx"),
    )


class Eval(Base):
    """One accuracy evaluation of a run (schema.Eval), per-item scores kept for the gate."""

    __table__ = Table(
        "evals", Base.metadata,
        Column("id", Integer, primary_key=True),
        Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False, index=True),
        *schema_columns(schema.EVAL),
    )


class ChangePoint(Base):
    __tablename__ = "change_points"
    __table_args__ = (Index("ix_change_points_series", "fingerprint", "branch"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    branch: Mapped[str] = mapped_column(String(255))
    metric: Mapped[str] = mapped_column(String(64))
    mode: Mapped[str | None] = mapped_column(String(16))  # the level's kind (schema.Point.mode); null: closed
    rate: Mapped[float | None] = mapped_column(Float)
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


def apply_run_filters(q, filters: dict):
    """``q`` narrowed to the runs that match ``filters`` (list_runs' and points_frame's, limit aside);
    a commit matches by prefix."""
    for key in ("engine", "model", "hardware", "branch", "fingerprint", "status", "workload"):
        if filters.get(key) is not None:
            q = q.where(getattr(Run, key) == filters[key])
    if filters.get("commit"):
        q = q.where(Run.commit.startswith(filters["commit"], autoescape=True))
    return q
