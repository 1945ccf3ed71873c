"""Alembic environment for the k2bench store. Store.open runs it programmatically on a connection
it already holds (inside a write transaction), passed in config.attributes["connection"]."""

from __future__ import annotations

from alembic import context

from k2bench.harness.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only reachable through the alembic CLI
    raise RuntimeError("k2bench migrations run through Store.open(), which passes a connection")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite cannot ALTER most things in place
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
