"""Bisection results in the store: written by `k2bench bisect`, read by the dashboard's history page."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

from sqlalchemy import insert, select

from k2bench.errors import UserError
from k2bench.harness.store.models import Culprit

if TYPE_CHECKING:
    import pandas as pd

CULPRIT_COLUMNS = ("id", "fingerprint", "branch", "metric", "concurrency", "good", "bad", "first_bad", "subject",
                   "steps", "created_at")


class CulpritsMixin:
    def add_culprit(self, row: dict) -> int:
        """Store one bisection's outcome (first_bad None: no culprit found); returns its id."""
        allowed = set(CULPRIT_COLUMNS) - {"id", "created_at"}
        unknown = set(row) - allowed
        if unknown:
            raise UserError(f"add_culprit: unknown field {sorted(unknown)[0]!r}")
        values = {k: row.get(k) for k in allowed}
        values["created_at"] = datetime.now(timezone.utc).replace(tzinfo=None)
        with self._writer() as s:
            return s.execute(insert(Culprit).values(**values).returning(Culprit.id)).scalar_one()

    def culprits_frame(self, fingerprint: str | None = None, branch: str | None = None) -> pd.DataFrame:
        """One row per stored bisection, oldest first."""
        import pandas as pd

        q = select(*(getattr(Culprit, c) for c in CULPRIT_COLUMNS))
        if fingerprint is not None:
            q = q.where(Culprit.fingerprint == fingerprint)
        if branch is not None:
            q = q.where(Culprit.branch == branch)
        with self._read() as s:
            rows = s.execute(q.order_by(Culprit.created_at, Culprit.id)).all()
        return pd.DataFrame(rows, columns=list(CULPRIT_COLUMNS))
