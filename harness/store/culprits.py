"""Bisection results in the store: written by `k2bench bisect`, read by the dashboard's history page."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

from sqlalchemy import insert

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
        return self._keyed_frame(Culprit, CULPRIT_COLUMNS, "created_at", fingerprint, branch)
