"""Storing k2bench.run documents: every document of one `k2bench import` in one transaction.

The duplicate check runs inside that write transaction, after the lock is taken: on SQLite the
store's write transactions begin with BEGIN IMMEDIATE (one writer at a time), on PostgreSQL an
advisory transaction lock serialises imports. So two processes importing the same file at once
store it once, and no schema change (unique constraint, migration) is needed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import insert, select, text
from sqlalchemy.orm import Session

from k2bench.errors import UserError
from k2bench.harness.record import runjson, schema
from k2bench.harness.store.models import Eval, Point, Request, Run

IMPORT_LOCK_KEY = 7231002  # pg_advisory_xact_lock key of imports (migrations use 7231001)
DUPLICATE_FIELDS = ("started_at", "commit", "engine", "model", "hardware", "workload")


class DuplicateRun(UserError):
    """A document whose run is already stored (same start, configuration and numbers)."""

    def __init__(self, index: int, run_id: int):
        super().__init__(f"this run is already stored as run {run_id}")
        self.index, self.run_id = index, run_id


def content_key(run: dict, points: Sequence[dict]) -> str:
    """What makes two runs the same measurement: start time, configuration and every level's numbers."""
    fields = {k: run.get(k) for k in DUPLICATE_FIELDS}
    levels = sorted(points, key=lambda p: json.dumps(schema.level_key(p), default=str))
    return json.dumps([fields, levels], sort_keys=True, default=str)


class ImportMixin:
    def import_run(self, doc: dict) -> int:
        """Store a k2bench.run document as a new run, all or nothing; returns the new id."""
        return self.import_runs([doc], allow_duplicate=True)[0]

    def import_runs(self, docs: Sequence[dict], *, allow_duplicate: bool = False) -> list[int]:
        """Store documents as new runs in one transaction (all of them or none); returns their ids.

        Unless allow_duplicate, a document whose run is already stored (or appears earlier in
        ``docs``) raises DuplicateRun (a UserError) and nothing is stored."""
        docs = [runjson.validate_doc(d) for d in docs]
        with self._writer() as s:
            if s.get_bind().dialect.name == "postgresql":
                s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": IMPORT_LOCK_KEY})
            ids = []
            for i, doc in enumerate(docs):
                if not allow_duplicate:
                    copy = _stored_copy(s, doc)
                    if copy is not None:
                        raise DuplicateRun(i, copy)
                ids.append(self._store_doc(s, doc))
            return ids

    def _store_doc(self, s: Session, doc: dict) -> int:
        by_level: dict[tuple, list[dict]] = {}
        for r in doc.get("requests") or []:
            by_level.setdefault(schema.level_key(r), []).append(r)
        row = self._new_run(doc["run"])
        s.add(row)
        s.flush()
        for p in doc["points"]:
            point_id = self._insert_point(s, row.id, p)
            reqs = by_level.get(schema.level_key(p))
            if reqs:
                s.execute(insert(Request), [self._json_request_row(r, row.id, point_id) for r in reqs])
        for ev in doc["evals"]:
            s.execute(insert(Eval).values(run_id=row.id, **schema.to_columns(schema.EVAL, ev)))
        return row.id


def _stored_copy(s: Session, doc: dict) -> int | None:
    """The id of a run in this transaction's view with the same content as ``doc``, if any."""
    started = schema.parse_time(doc["run"]["started_at"]).replace(tzinfo=None)
    want = content_key(doc["run"], doc["points"])
    for run in s.execute(select(Run).where(Run.started_at == started).order_by(Run.id)).scalars():
        points = s.execute(select(Point).where(Point.run_id == run.id)
                           .order_by(Point.mode, Point.rate, Point.concurrency, Point.trial)).scalars()
        stored = schema.from_columns(schema.RUN, run)
        if content_key(stored, [schema.from_columns(schema.POINT, p) for p in points]) == want:
            return run.id
    return None
