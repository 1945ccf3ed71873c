"""SLO figures of stored levels, under any SLO: from the stored requests, so that runs swept without an
SLO, with another one, or imported with per-request data are judged by the same rule
(k2bench.harness.measure.slo) as a sweep given ``--slo``.

A level whose run was swept under the same SLO keeps its stored figures; any other level is recomputed
from its requests (its stored duration and the run's GPU count, as the sweep used). A level without
stored requests (a summary imported from another tool) gets no figures (None), never an estimate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from k2bench.errors import UserError
from k2bench.harness.measure.slo import FIELDS, Slo, attainment, parse_slo

if TYPE_CHECKING:
    import pandas as pd


def level_figures(store, run_id: int, point: dict, num_gpus: int, slo: Slo) -> dict:
    """The SLO fields of one stored level (None each when it has no stored requests)."""
    records = store.load_records(run_id, concurrency=point["concurrency"], trial=point.get("trial") or 0)
    if not records:
        return dict.fromkeys(FIELDS)
    return attainment(records, slo, duration_s=point.get("duration_s"), num_gpus=num_gpus).fields()


def with_slo(store, points: pd.DataFrame, slo: Slo) -> pd.DataFrame:
    """``points`` (Store.points_frame rows) with every level's SLO fields under ``slo``; ``slo`` column set."""
    out = points.copy()
    if len(out) == 0:
        return out.assign(slo=slo.text) if "slo" not in out.columns else out
    for col in (*FIELDS, "slo"):
        if col not in out.columns:
            out[col] = None
        out[col] = out[col].astype(object)
    for i, row in out.iterrows():
        if row["slo"] == slo.text:
            continue
        point = {"concurrency": int(row["concurrency"]), "trial": int(row["trial"]),
                 "duration_s": None if row["duration_s"] is None or row["duration_s"] != row["duration_s"]
                 else float(row["duration_s"])}
        for col, value in level_figures(store, int(row["run_id"]), point, int(row["num_gpus"]), slo).items():
            out.at[i, col] = value
        out.at[i, "slo"] = slo.text
    for col in FIELDS:
        out[col] = out[col].astype(float)
    return out


def comparison_slo(given: str | None, runs: list[dict]) -> Slo | None:
    """The SLO a comparison judges by: the one given, else the one the (candidate) runs were swept under.

    Runs swept under different SLOs give no common one: the caller must say which (``--slo``)."""
    if given:
        return parse_slo(given)
    found = sorted({r["slo"] for r in runs if r.get("slo")})
    if len(found) > 1:
        raise UserError(f"the runs were swept under different SLOs ({'; '.join(found)}); pass --slo to judge "
                        "them all by one")
    return parse_slo(found[0]) if found else None
