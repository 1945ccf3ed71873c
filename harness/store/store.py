"""The Store: writes runs level by level, reads them back as dicts, documents and DataFrames.

Every write is its own short transaction: create_run, each add_point (the level's summary plus
all its raw requests), finish_run. So a sweep killed mid-way keeps every finished level.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from datetime import datetime, timezone

import numpy as np
from sqlalchemy import case, delete, func, insert, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from k2bench import __version__
from k2bench.errors import UserError
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.record import runjson, schema
from k2bench.harness.record.fingerprint import fingerprint
from k2bench.harness.store import db, upgrade
from k2bench.harness.store.codec import decode_deltas, decode_stamps, encode_stamps
from k2bench.harness.store.culprits import CulpritsMixin
from k2bench.harness.store.frames import FramesMixin
from k2bench.harness.store.importing import ImportMixin
from k2bench.harness.store.liveness import current_writer, heartbeat_expired, store_now, writer_alive
from k2bench.harness.store.models import ChangePoint, Eval, Point, Request, Run, apply_run_filters

RUN_FIELD_NAMES = frozenset(s.name for s in schema.RUN)
_INVALID = func.sum(case((Point.valid.is_(False), 1), else_=0))  # a run's levels that do not count
RUN_FILTERS = ("engine", "model", "hardware", "branch", "commit", "fingerprint", "status", "workload", "limit")


def _utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _to_db_time(text: str | None) -> datetime | None:
    if text is None:
        return None
    return schema.parse_time(text).replace(tzinfo=None)


def effective_status(run: Run, now: datetime | None = None) -> str:
    """The stored status, except that a "running" run whose writer is known to be gone reads as
    "partial": it was killed before finish_run. Gone: on this host, its process no longer exists; from
    any host, its heartbeat is older than the lease at ``now`` (the store's clock; None: not judged)."""
    if run.status != "running":
        return run.status
    if not writer_alive(run.writer_host, run.writer_pid, run.writer_start):
        return "partial"
    if now is not None and heartbeat_expired(run.heartbeat_at, now):
        return "partial"
    return run.status


class Store(FramesMixin, CulpritsMixin, ImportMixin):
    """Handle on one k2bench database. Use ``Store.open(url)``."""

    def __init__(self, url: str, read_engine: Engine, write_engine: Engine | None):
        self.url = url
        self._read = sessionmaker(read_engine, expire_on_commit=False)
        self._write = sessionmaker(write_engine, expire_on_commit=False) if write_engine is not None else None
        self._engines = [e for e in {read_engine, write_engine} if e is not None]
        self.clock = store_now  # what "now" is for heartbeats; tests move it instead of waiting

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, url: str | None = None, readonly: bool = False) -> Store:
        """Open the database at url. Read-write: create it, or upgrade its schema to head (store/upgrade.py:
        a SQLite file is copied first; PostgreSQL only through `k2bench db upgrade`). Read-only: refuse any
        schema but head, never upgrading."""
        url = url or db.default_db_url()
        parsed = db.parse_url(url)
        path = db.require_existing(parsed) if readonly else db.sqlite_path(parsed)
        if path is not None and not readonly:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UserError(f"cannot create the folder for {path}: {exc.strerror or exc}") from None
        read_engine, write_engine = db.make_engines(parsed, readonly)
        try:
            if write_engine is not None:
                upgrade.migrate(write_engine)
            else:
                upgrade.check_schema(read_engine)
        except BaseException as exc:  # a schema from a newer k2bench (UserError) too: no engine left open
            for e in {read_engine, write_engine} - {None}:
                e.dispose()
            if isinstance(exc, SQLAlchemyError):
                raise UserError(f"cannot open database {db.safe_url(parsed)}: {db.first_line(exc)}") from None
            raise
        return cls(url, read_engine, write_engine)

    def close(self) -> None:
        for engine in self._engines:
            engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _writer(self) -> Session:
        if self._write is None:
            raise UserError("this store was opened read-only")
        return self._write.begin()

    # ------------------------------------------------------------------ writing
    def create_run(self, meta: dict) -> int:
        """Record a new run (status "running" unless meta says otherwise); returns its id.

        Defaults: started_at now, num_gpus = tp or 1, trials 1, fingerprint computed from meta.
        Unknown keys are a UserError (see k2bench.harness.record.schema.Run).
        """
        meta = dict(meta)
        meta.pop("id", None)
        meta.setdefault("status", "running")
        meta.setdefault("started_at", runjson.format_time(datetime.now(timezone.utc)))
        if meta.get("num_gpus") is None:
            meta["num_gpus"] = meta.get("tp") or 1
        meta.setdefault("client", {"k2bench": __version__, "host": socket.gethostname()})
        run = runjson.validate_run(meta)
        with self._writer() as s:
            row = self._new_run(run)
            row.writer_host, row.writer_pid, row.writer_start = current_writer()
            row.heartbeat_at = self.clock(s)
            s.add(row)
            s.flush()
            return row.id

    @staticmethod
    def _new_run(run: dict) -> Run:
        values = schema.to_columns(schema.RUN, run)
        values["fingerprint"] = values["fingerprint"] or fingerprint(run)
        return Run(**values, updated_at=_utcnow())

    def add_point(self, run_id: int, point: dict, records: Sequence[RequestRecord] | None = None) -> int:
        """Commit one finished level (its summary and raw requests) in its own transaction."""
        p = runjson.validate_point(point)
        with self._writer() as s:
            run = self._require_run(s, run_id)
            same_rate = Point.rate.is_(None) if p["rate"] is None else Point.rate == p["rate"]
            clash = select(Point.id).where(Point.run_id == run.id, Point.mode == p["mode"], same_rate,
                                           Point.concurrency == p["concurrency"], Point.trial == p["trial"])
            if s.execute(clash).first() is not None:
                what = "" if p["mode"] == "closed" else f"rate {p['rate']:g}/s, "
                raise UserError(
                    f"run {run_id} already has a level at {what}concurrency {p['concurrency']}, trial {p['trial']}"
                )
            point_id = self._insert_point(s, run.id, p)
            if records:
                rows = [_record_row(r, run.id, point_id, p["trial"]) for r in records]
                s.execute(insert(Request), rows)
            s.execute(update(Run).where(Run.id == run.id).values(updated_at=_utcnow()))
            return point_id

    @staticmethod
    def _insert_point(s: Session, run_id: int, p: dict) -> int:
        values = schema.to_columns(schema.POINT, p)
        values.update(run_id=run_id, created_at=_utcnow())
        return s.execute(insert(Point).values(**values).returning(Point.id)).scalar_one()

    def set_profile(self, run_id: int, profile: dict) -> None:
        """Keep a run's profiled pass (--profile-level; one per run)."""
        checked = runjson.validate_run_field("profile", profile)
        with self._writer() as s:
            run = self._require_run(s, run_id)
            s.execute(update(Run).where(Run.id == run.id).values(profile=checked, updated_at=_utcnow()))

    def beat(self, run_id: int) -> None:
        """Refresh a running run's heartbeat (store/heartbeat.py calls this from its thread)."""
        with self._writer() as s:
            s.execute(update(Run).where(Run.id == run_id, Run.status == "running")
                      .values(heartbeat_at=self.clock(s)))

    def update_run_extra(self, run_id: int, fields: dict) -> None:
        """Merge ``fields`` into the run's extra (what a command learns only after its levels, e.g. the
        capacity search's result)."""
        with self._writer() as s:
            run = self._require_run(s, run_id)
            extra = {**(run.extra or {}), **fields}
            s.execute(update(Run).where(Run.id == run.id).values(extra=extra, updated_at=_utcnow()))

    def finish_run(self, run_id: int, status: str) -> None:
        """Mark a run complete, partial (interrupted, finished levels kept) or failed."""
        if status not in ("complete", "partial", "failed"):
            raise UserError(f"finish_run: status must be complete, partial or failed, not {status!r}")
        with self._writer() as s:
            run = self._require_run(s, run_id)
            now = _utcnow()
            s.execute(update(Run).where(Run.id == run.id).values(status=status, finished_at=now, updated_at=now))

    @staticmethod
    def _json_request_row(r: dict, run_id: int, point_id: int) -> dict:  # for ImportMixin
        return _json_request_row(r, run_id, point_id)

    def add_eval(self, run_id: int, ev: dict) -> None:
        """Store one accuracy evaluation of a run (schema.Eval) in its own transaction."""
        e = runjson.validate_eval(ev)
        with self._writer() as s:
            run = self._require_run(s, run_id)
            s.execute(insert(Eval).values(run_id=run.id, **schema.to_columns(schema.EVAL, e)))
            s.execute(update(Run).where(Run.id == run.id).values(updated_at=_utcnow()))

    def get_evals(self, run_id: int) -> list[dict]:
        """A run's accuracy evaluations in the order they were stored."""
        with self._read() as s:
            run = self._require_run(s, run_id)
            return _evals_of(s, [run.id]).get(run.id, [])

    def evals_by_run(self, run_ids: Sequence[int]) -> dict[int, list[dict]]:
        """{run id: its evaluations} for many runs at once (runs without any are left out)."""
        with self._read() as s:
            return _evals_of(s, list(run_ids))

    def delete_run(self, run_id: int) -> None:
        with self._writer() as s:
            run = self._require_run(s, run_id)
            s.execute(delete(Request).where(Request.run_id == run.id))
            s.execute(delete(Eval).where(Eval.run_id == run.id))
            s.execute(delete(Point).where(Point.run_id == run.id))
            s.execute(delete(Run).where(Run.id == run.id))

    def replace_change_points(self, fingerprint: str, branch: str, rows: list[dict]) -> None:
        """Replace every stored change point of one (fingerprint, branch) series at once."""
        allowed = {"metric", "mode", "rate", "concurrency", "run_id", "commit", "detected_at", "mean_before",
                   "mean_after", "rel_change", "p_value"}
        clean = []
        for i, r in enumerate(rows):
            unknown = set(r) - allowed
            if unknown:
                raise UserError(f"change point {i}: unknown field {sorted(unknown)[0]!r}")
            row = {k: r.get(k) for k in allowed}
            row["mode"] = row["mode"] or "closed"  # rows from before rate levels are closed-loop levels
            det = row["detected_at"]
            if isinstance(det, str):
                row["detected_at"] = _to_db_time(det)
            elif isinstance(det, datetime) and det.tzinfo is not None:
                row["detected_at"] = det.astimezone(timezone.utc).replace(tzinfo=None)
            row.update(fingerprint=fingerprint, branch=branch)
            clean.append(row)
        with self._writer() as s:
            s.execute(delete(ChangePoint).where(ChangePoint.fingerprint == fingerprint,
                                                ChangePoint.branch == branch))
            if clean:
                s.execute(insert(ChangePoint), clean)

    # ------------------------------------------------------------------ reading
    @staticmethod
    def _require_run(s: Session, run_id) -> Run:
        rid = _as_run_id(run_id)
        run = s.get(Run, rid) if rid is not None else None
        if run is None:
            raise UserError(f"no run with id {run_id!r} in this database (see `k2bench runs`)")
        return run

    def get_run(self, run_id: int) -> dict:
        """The run's metadata (the "run" object of the JSON) plus levels and effective_status."""
        with self._read() as s:
            run = self._require_run(s, run_id)
            levels, invalid = s.execute(select(func.count(), _INVALID).select_from(Point)
                                        .where(Point.run_id == run.id)).one()
            return _run_dict(run, levels, invalid or 0, self.clock(s))

    def list_runs(self, **filters) -> list[dict]:
        """Runs newest first. Filters: engine, model, hardware, branch, commit (prefix), fingerprint,
        status (stored status), workload, limit."""
        unknown = set(filters) - set(RUN_FILTERS)
        if unknown:
            raise UserError(f"list_runs: unknown filter {sorted(unknown)[0]!r} (known: {', '.join(RUN_FILTERS)})")
        levels = (select(Point.run_id, func.count().label("n"), _INVALID.label("bad"))
                  .group_by(Point.run_id)).subquery()
        q = (select(Run, func.coalesce(levels.c.n, 0), func.coalesce(levels.c.bad, 0))
             .outerjoin(levels, levels.c.run_id == Run.id))
        q = apply_run_filters(q, filters).order_by(Run.started_at.desc(), Run.id.desc())
        if filters.get("limit"):
            q = q.limit(int(filters["limit"]))
        with self._read() as s:
            now = self.clock(s)
            return [_run_dict(run, n, bad, now) for run, n, bad in s.execute(q).all()]

    def export_run(self, run_id: int, include_requests: bool = False) -> dict:
        """The run as a k2bench.run document (points ordered by concurrency, trial)."""
        with self._read() as s:
            run = self._require_run(s, run_id)
            points = s.execute(
                select(Point).where(Point.run_id == run.id).order_by(Point.mode, Point.rate, Point.concurrency, Point.trial)
            ).scalars().all()
            run_obj = {k: v for k, v in _run_dict(run, len(points)).items() if k in RUN_FIELD_NAMES}
            doc = runjson.build_doc(run_obj, [_point_dict(p) for p in points],
                                    evals=_evals_of(s, [run.id]).get(run.id, []))
            if include_requests:
                reqs = s.execute(
                    select(Request).where(Request.run_id == run.id)
                    .order_by(Request.mode, Request.rate, Request.concurrency, Request.trial, Request.idx, Request.id)
                ).scalars().all()
                doc["requests"] = [_request_json(r) for r in reqs]
            return doc

    def load_records(self, run_id: int, concurrency: int | None = None, trial: int | None = None,
                     include_warmup: bool = False) -> list[RequestRecord]:
        """Stored raw records as RequestRecord objects (e.g. to re-summarise a level)."""
        return [rec for _, rec in self._records(run_id, concurrency, trial, include_warmup)]

    def _records(self, run_id, concurrency, trial, include_warmup) -> list[tuple[Request, RequestRecord]]:
        with self._read() as s:
            run = self._require_run(s, run_id)
            q = select(Request).where(Request.run_id == run.id)
            if concurrency is not None:
                q = q.where(Request.concurrency == concurrency)
            if trial is not None:
                q = q.where(Request.trial == trial)
            if not include_warmup:
                q = q.where(Request.warmup.is_(False))
            rows = s.execute(q.order_by(Request.mode, Request.rate, Request.concurrency, Request.trial, Request.idx, Request.id)).scalars().all()
            return [(r, _row_record(r)) for r in rows]


def _evals_of(s: Session, run_ids: list[int]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    if not run_ids:
        return out
    rows = s.execute(select(Eval).where(Eval.run_id.in_(run_ids)).order_by(Eval.run_id, Eval.id)).scalars()
    for r in rows:
        out.setdefault(r.run_id, []).append(schema.from_columns(schema.EVAL, r))
    return out


def _as_run_id(run_id) -> int | None:
    if isinstance(run_id, bool):
        return None
    if isinstance(run_id, int):
        return run_id
    if isinstance(run_id, str) and run_id.strip().isdigit():
        return int(run_id.strip())
    return None


def _run_dict(run: Run, levels: int, invalid: int = 0, now: datetime | None = None) -> dict:
    out: dict = {"id": run.id, **schema.from_columns(schema.RUN, run)}
    out["levels"] = levels
    out["invalid_levels"] = int(invalid)
    out["effective_status"] = effective_status(run, now)
    return out


def _point_dict(p: Point) -> dict:
    return schema.from_columns(schema.POINT, p)  # every field, null where not measured


def _record_row(r: RequestRecord, run_id: int, point_id: int, trial: int) -> dict:
    obj = {s.name: getattr(r, s.name) for s in schema.REQUEST if s.sql is not None and s.name != "trial"}
    obj.update(trial=trial, warmup=bool(r.warmup), success=bool(r.success))
    return _request_row(obj, r.send_ns, r.token_ns, run_id, point_id)


def _json_request_row(r: dict, run_id: int, point_id: int) -> dict:
    token_ns = (np.cumsum(np.asarray(r["token_delta_ns"], dtype=np.int64)) + np.int64(r["send_ns"])).tolist()
    return _request_row(r, r["send_ns"], token_ns, run_id, point_id)


def _request_row(obj: dict, send_ns: int, token_ns: list[int], run_id: int, point_id: int) -> dict:
    return {**schema.to_columns(schema.REQUEST, obj), "point_id": point_id, "run_id": run_id,
            "n_tokens": len(token_ns), "token_deltas": encode_stamps(send_ns, token_ns)}


def _row_record(r: Request) -> RequestRecord:
    return RequestRecord(
        index=r.idx, concurrency=r.concurrency, warmup=r.warmup, requested_input_tokens=r.requested_input_tokens,
        requested_output_tokens=r.requested_output_tokens, send_ns=r.send_ns,
        token_ns=decode_stamps(r.send_ns, r.token_deltas), end_ns=r.end_ns, prompt_tokens=r.prompt_tokens,
        output_tokens=r.output_tokens, success=r.success, error=r.error, mode=r.mode or "closed", rate=r.rate,
        intended_ns=r.intended_ns, queue_ns=r.queue_ns, cached_tokens=r.cached_tokens, session=r.session, turn=r.turn,
    )


def _request_json(r: Request) -> dict:
    out = schema.from_columns(schema.REQUEST, r)
    out["token_delta_ns"] = decode_deltas(r.token_deltas).tolist()
    return {s.name: out[s.name] for s in schema.REQUEST}  # in the schema's order
