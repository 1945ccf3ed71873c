"""DataFrame readers of the Store (analysis and the dashboard read through these)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from sqlalchemy import select

from k2bench.harness.measure.metrics import request_metrics
from k2bench.harness.record import schema
from k2bench.harness.store.codec import decode_deltas
from k2bench.harness.store.models import ChangePoint, Point, Request, Run, apply_run_filters

if TYPE_CHECKING:
    import pandas as pd

# Both derived from k2bench.harness.record.schema: the run's short fields, then the level's flat columns.
RUN_COLUMNS = schema.RUN_SUMMARY_FIELDS
POINT_COLUMNS = schema.POINT_COLUMNS
_TIME_COLUMNS = tuple(s.name for s in schema.RUN if s.base == "time")
REQUEST_COLUMNS = ("mode", "rate", "concurrency", "trial", "index", "send_s", "end_s", "ttft_ms", "tpot_ms", "e2el_ms",
                   "output_tokens", "requested_output_tokens", "success", "error", "osl_mismatch",
                   "requested_input_tokens", "prompt_tokens", "cached_tokens", "session", "turn")
CHANGE_POINT_COLUMNS = ("id", "fingerprint", "branch", "metric", "mode", "rate", "concurrency", "run_id", "commit", "detected_at",
                        "mean_before", "mean_after", "rel_change", "p_value")


class FramesMixin:
    def points_frame(self, run_ids=None, **filters) -> pd.DataFrame:
        """One row per (run, concurrency, trial), run metadata joined in; ordered by run start, level.

        ``status`` in the frame is the stored status; filters as in list_runs (limit excluded)."""
        import pandas as pd

        filters.pop("limit", None)
        cols = [Point.run_id, *(getattr(Run, c) for c in RUN_COLUMNS), *(getattr(Point, c) for c in POINT_COLUMNS)]
        q = select(*cols).join(Run, Run.id == Point.run_id)
        if run_ids is not None:
            q = q.where(Point.run_id.in_([int(r) for r in run_ids]))
        q = apply_run_filters(q, filters).order_by(Run.started_at, Run.id, Point.mode, Point.rate, Point.concurrency,
                                                   Point.trial)
        with self._read() as s:
            rows = s.execute(q).all()
        df = pd.DataFrame(rows, columns=["run_id", *RUN_COLUMNS, *POINT_COLUMNS])
        for name in _TIME_COLUMNS:
            df[name] = pd.to_datetime(df[name], utc=True)
        return df

    def requests_frame(self, run_id: int, concurrency: int | None = None) -> pd.DataFrame:
        """One row per measured (non-warmup) request, latencies re-derived from the raw stamps.

        send_s / end_s are seconds from the level's first send (per level: kind, concurrency and trial)."""
        import pandas as pd

        pairs = self._records(run_id, concurrency, None, False)
        start: dict[tuple, int] = {}
        for row, rec in pairs:
            key = schema.level_key(row)
            start[key] = min(start.get(key, rec.send_ns), rec.send_ns)
        out = []
        for row, rec in pairs:
            t0 = start[schema.level_key(row)]
            m = request_metrics(rec, with_itl=False)
            out.append((
                row.mode or "closed", row.rate, row.concurrency, row.trial, rec.index, (rec.send_ns - t0) / 1e9,
                None if rec.end_ns is None else (rec.end_ns - t0) / 1e9,
                m["ttft_ms"], m["tpot_ms"], m["e2el_ms"], rec.output_tokens, rec.requested_output_tokens,
                rec.success, rec.error, rec.osl_mismatch, rec.requested_input_tokens, rec.prompt_tokens,
                rec.cached_tokens, rec.session, rec.turn,
            ))
        return pd.DataFrame(out, columns=list(REQUEST_COLUMNS))

    def itl_ms(self, run_id: int, concurrency: int, mode: str = "closed", rate: float | None = None) -> np.ndarray:
        """Every inter-token gap (ms) of the level's successful measured requests, all trials (a closed
        level unless ``mode``/``rate`` name a rate level)."""
        with self._read() as s:
            run = self._require_run(s, run_id)
            same_rate = Request.rate.is_(None) if rate is None else Request.rate == rate
            blobs = s.execute(
                select(Request.token_deltas).where(
                    Request.run_id == run.id, Request.concurrency == concurrency, Request.mode == mode, same_rate,
                    Request.warmup.is_(False), Request.success.is_(True),
                ).order_by(Request.trial, Request.idx)
            ).scalars().all()
        gaps = [decode_deltas(b)[1:] for b in blobs]
        if not gaps:
            return np.zeros(0, dtype=np.float64)
        return np.concatenate(gaps).astype(np.float64) / 1e6

    def change_points_frame(self, fingerprint: str | None = None, branch: str | None = None) -> pd.DataFrame:
        """One row per stored change point, oldest first."""
        import pandas as pd

        df = self._keyed_frame(ChangePoint, CHANGE_POINT_COLUMNS, "detected_at", fingerprint, branch)
        df["detected_at"] = pd.to_datetime(df["detected_at"], utc=True)
        return df

    def _keyed_frame(
        self, model: type, columns: tuple[str, ...], when: str, fingerprint: str | None, branch: str | None
    ) -> pd.DataFrame:
        """`columns` of a table whose rows belong to a (fingerprint, branch) history (change points, culprits),
        ordered by `when` then id; a None filter keeps every value. One query for the nightly scan's and the
        bisection's tables."""
        import pandas as pd

        q = select(*(getattr(model, c) for c in columns))
        if fingerprint is not None:
            q = q.where(model.fingerprint == fingerprint)
        if branch is not None:
            q = q.where(model.branch == branch)
        with self._read() as s:
            rows = s.execute(q.order_by(getattr(model, when), model.id)).all()
        return pd.DataFrame(rows, columns=list(columns))
