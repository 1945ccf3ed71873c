"""Read-only data layer of the dashboard: store access, cached queries and the table shaping
each page needs. Everything here works on the DataFrames the store returns, so pages and the
benchmark share one code path; Streamlit caching wraps it only at the edges (``cached_*``)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from k2bench.harness.measure.catalogue import BY_COLUMN, LEVEL_TABLE_FIELDS, TABLE_METRICS, over_trials
from k2bench.harness.record import schema

DB_ENV = "K2BENCH_DB"

# column -> catalogue entry (label, unit, direction) of every metric the pages can plot
METRICS = BY_COLUMN
FILTER_COLUMNS = ("engine", "model", "hardware", "workload", "branch")
CONFIG_FIELDS = ("engine", "engine_version", "model", "precision", "hardware", "num_gpus", "tp", "workload")


# ---------------------------------------------------------------- store access


def resolve_db_url(url: str | None = None) -> str:
    if url:
        return url
    if os.environ.get(DB_ENV):
        return os.environ[DB_ENV]
    from k2bench.harness.store import default_db_url

    return default_db_url()


def open_store(url: str):
    """The dashboard never writes: the store is always opened read-only."""
    from k2bench.harness.store import Store

    return Store.open(url, readonly=True)


def pareto_mask(x, y, maximize_x: bool = True, maximize_y: bool = True) -> np.ndarray:
    """Which points lie on the frontier, by the analysis package's definition (both axes maximised).

    An axis where lower is better (a latency) is handed over as its reciprocal, which keeps the
    order reversed and the values positive, as the analysis frontier requires."""
    from k2bench.harness.analysis.pareto import frontier

    xs = np.asarray(x, dtype=float)
    ys = np.asarray(y, dtype=float)
    with np.errstate(divide="ignore"):
        tx = xs if maximize_x else 1.0 / xs
        ty = ys if maximize_y else 1.0 / ys
    front = {(float(a), float(b)) for a, b in frontier(tx, ty)}
    return np.array([(float(a), float(b)) in front for a, b in zip(tx, ty, strict=True)], dtype=bool)


RUN_COLUMNS = ["run_id", *schema.RUN_SUMMARY_FIELDS, "levels"]
_TIME_FIELDS = [s.name for s in schema.RUN if s.base == "time"]
# The run page: metadata rows, then one row per level with these columns.
META_FIELDS = list(schema.RUN_SUMMARY_FIELDS)
LEVEL_COLUMNS = ["concurrency", "valid", "completed", "failed", *(f.column for f in LEVEL_TABLE_FIELDS),
                 *(m.column for m in TABLE_METRICS), "invalid_reason"]


def load_runs(store) -> pd.DataFrame:
    """Every run (one row each, newest first) with its configuration label; pages pick from this
    and then load the points of only the runs they show."""
    rows = store.list_runs()
    df = pd.DataFrame([{**r, "run_id": r["id"]} for r in rows])
    if df.empty:
        return pd.DataFrame(columns=[*RUN_COLUMNS, "config"])
    df = df[RUN_COLUMNS].copy()
    for name in _TIME_FIELDS:
        df[name] = pd.to_datetime(df[name], utc=True, format="ISO8601")
    df["config"] = config_labels(df)
    return df


def load_points(store, run_ids=None, include_invalid: bool = False) -> pd.DataFrame:
    """Points of the given runs (all runs when None) with configuration labels. Invalid levels (kept
    in the store with their reason) are left out unless asked for, as in frontiers and the gate."""
    df = store.points_frame(run_ids=None if run_ids is None else list(run_ids))
    if not include_invalid and "valid" in df.columns:
        df = df[df["valid"].fillna(False).astype(bool)]
    if df.empty:
        return df.assign(config=pd.Series(dtype=str), level=pd.Series(dtype=str))
    df = df.copy()
    df["started_at"] = pd.to_datetime(df["started_at"], utc=True)
    df["config"] = config_labels(df)
    return with_levels(df)


OPEN_LOOP = " · open loop"  # what tells a configuration's rate levels from its closed ones on a chart


def with_levels(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with each row's ``level`` label (c8 closed, r2/s rate: schema.level_label); a rate level's
    configuration label gains OPEN_LOOP, so frontiers and pooled medians draw the two kinds apart."""
    if df.empty or "mode" not in df.columns:
        return df.assign(level=[f"c{int(c)}" for c in df["concurrency"]]) if len(df) else df.assign(level="")
    mode = df["mode"].fillna("closed")
    rate = df["rate"].where(df["rate"].notna(), None)
    df = df.assign(level=[schema.level_label(m, r, int(c)) for m, r, c in zip(mode, rate, df["concurrency"],
                                                                                strict=True)])
    if "config" in df.columns:
        df["config"] = df["config"].where(mode == "closed", df["config"] + OPEN_LOOP)
    return df


def _level_keys(df: pd.DataFrame) -> list[str]:
    return ["level"] if "level" in df.columns else ["concurrency"]


def latest_run_ids(runs: pd.DataFrame) -> list[int]:
    """The most recent run of each configuration."""
    ordered = runs.sort_values(["started_at", "run_id"])
    return [int(r) for r in ordered.groupby("config").tail(1)["run_id"]]


def config_labels(df: pd.DataFrame) -> pd.Series:
    """A readable name per configuration; the fingerprint suffix keeps unlike configs apart."""

    def one(row) -> str:
        version = f" {row['engine_version']}" if _present(row.get("engine_version")) else ""
        parts = [f"{row['engine']}{version}", row.get("model"), row.get("precision"), row.get("hardware")]
        parts.append(f"TP{int(row['tp'])}" if _present(row.get("tp")) else None)
        parts.append(row.get("workload"))
        text = " · ".join(str(p) for p in parts if _present(p))
        fp = row.get("fingerprint")
        return f"{text} [{str(fp)[:6]}]" if _present(fp) else text

    def key(row) -> tuple:  # NaN != NaN: a missing field (an imported run without tp) must still match
        return tuple(v if _present(v) else None for v in row)

    keys = df[[c for c in (*CONFIG_FIELDS, "fingerprint") if c in df.columns]].drop_duplicates()
    names = {key(r): one(dict(zip(keys.columns, r, strict=True))) for r in keys.itertuples(index=False)}
    return pd.Series([names[key(r)] for r in df[keys.columns].itertuples(index=False)], index=df.index)


def _present(value) -> bool:
    return value is not None and not (isinstance(value, float) and np.isnan(value)) and value != ""


# ---------------------------------------------------------------- filters and aggregation


def filter_points(df: pd.DataFrame, selections: dict[str, list], date_range=None) -> pd.DataFrame:
    """Keep rows whose column values are in each non-empty selection and within the date range."""
    keep = pd.Series(True, index=df.index)
    for col, chosen in selections.items():
        if chosen:
            keep &= df[col].isin(chosen)
    if date_range:
        lo, hi = (pd.Timestamp(d) for d in date_range)
        lo = lo.tz_localize("UTC") if lo.tzinfo is None else lo
        hi = (hi.tz_localize("UTC") if hi.tzinfo is None else hi) + pd.Timedelta(days=1)
        keep &= (df["started_at"] >= lo) & (df["started_at"] < hi)
    return df[keep]


def per_run_levels(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, concurrency): each metric and per-level number reduced over trials as
    everywhere else (catalogue.over_trials, the median); run fields taken from the first trial."""
    if df.empty:
        return df
    keys = ["run_id", *_level_keys(df)]
    numeric = [c for c in df.columns if c in METRICS or c in schema.LEVEL_NUMBERS]
    agg = over_trials(df, numeric, keys).set_index(keys)
    first_cols = [c for c in df.columns if c not in numeric and c not in keys and c != "trial"]
    first = df.groupby(keys, sort=False)[first_cols].first()
    return agg.join(first).reset_index()


def level_table(levels: pd.DataFrame) -> pd.DataFrame:
    """The run page's per-level table (LEVEL_COLUMNS present in ``levels``), by concurrency."""
    return levels[[c for c in LEVEL_COLUMNS if c in levels.columns]].sort_values("concurrency")


def latest_run_per_config(df: pd.DataFrame) -> pd.DataFrame:
    """Levels of the most recent run of each configuration (the default frontier view)."""
    if df.empty:
        return df
    latest = latest_run_ids(df[["config", "run_id", "started_at"]].drop_duplicates("run_id"))
    return per_run_levels(df[df["run_id"].isin(latest)])


def median_over_runs(df: pd.DataFrame, by: str = "config") -> pd.DataFrame:
    """Levels pooled over every run in the selection: median per (group, concurrency)."""
    if df.empty:
        return df
    levels = per_run_levels(df)
    numeric = [c for c in levels.columns if c in METRICS]
    keys = [by, *_level_keys(levels)]
    out = levels.groupby(keys, sort=False)[numeric].median()
    out["runs"] = levels.groupby(keys, sort=False)["run_id"].nunique()
    if "level" in keys:  # the concurrency of each level, beside its label
        out["concurrency"] = levels.groupby(keys, sort=False)["concurrency"].first()
    return out.reset_index()


def frontier_points(levels: pd.DataFrame, x: str, y: str, maximize_x: bool, maximize_y: bool,
                    by: str = "config") -> pd.DataFrame:
    """The non-dominated levels of each group, ordered along x for drawing a line."""
    parts = []
    for _, grp in levels.groupby(by, sort=False):
        mask = pareto_mask(grp[x].to_numpy(), grp[y].to_numpy(), maximize_x, maximize_y)
        parts.append(grp[mask].sort_values(x))
    return pd.concat(parts) if parts else levels.iloc[0:0]


# ---------------------------------------------------------------- history


def history_series(df: pd.DataFrame, fingerprint: str, concurrency: int, metric: str,
                   branch: str | None = None, level: str | None = None) -> pd.DataFrame:
    """One row per run of a configuration at one level, in time order: a closed level at ``concurrency``
    unless ``level`` names one by its label (r2/s)."""
    level = level or f"c{concurrency}"
    df = df if "level" in df.columns else with_levels(df)
    sel = df[(df["fingerprint"] == fingerprint) & (df["level"] == level)]
    if branch:
        sel = sel[sel["branch"] == branch]
    levels = per_run_levels(sel)
    if levels.empty:
        return levels
    cols = ["run_id", "commit", "branch", "started_at", "status", "concurrency", metric]
    return levels[cols].sort_values(["started_at", "run_id"]).reset_index(drop=True)


def mark_change_points(cps: pd.DataFrame, metric: str, concurrency: int, level: str | None = None) -> pd.DataFrame:
    """Change points of one metric and level (closed at ``concurrency`` unless ``level`` names another),
    each labelled a regression or an improvement."""
    if cps is None or cps.empty:
        return pd.DataFrame(columns=["run_id", "commit", "rel_change", "p_value", "kind"])
    labels = with_levels(cps.drop(columns=["level"], errors="ignore"))["level"]
    sel = cps[(cps["metric"] == metric) & (labels == (level or f"c{concurrency}"))].copy()
    higher = METRICS[metric].higher_is_better if metric in METRICS else True
    worse = sel["rel_change"] < 0 if higher else sel["rel_change"] > 0
    sel["kind"] = np.where(worse, "regression", "improvement")
    return sel


COMMIT_URL_ENV = "K2BENCH_COMMIT_URL"  # e.g. https://github.com/org/repo/commit/{commit}


def commit_url(commit, template: str | None = None) -> str | None:
    """The web page of a commit, from K2BENCH_COMMIT_URL (a template with {commit}); None without one."""
    template = template if template is not None else os.environ.get(COMMIT_URL_ENV)
    if not template or not commit or not isinstance(commit, str) or "{commit}" not in template:
        return None
    return template.format(commit=commit)


def mark_culprits(culprits: pd.DataFrame | None, series: pd.DataFrame, metric: str,
                  concurrency: int) -> pd.DataFrame:
    """Bisected culprits of one metric and level, placed on the run where the series first got worse
    (the bisection's bad end: the culprit itself usually has no run of its own)."""
    cols = ["run_id", "bad", "good", "first_bad", "subject"]
    if culprits is None or culprits.empty or series.empty:
        return pd.DataFrame(columns=cols)
    sel = culprits[(culprits["metric"] == metric) & (culprits["concurrency"] == concurrency)
                   & culprits["first_bad"].notna()]
    runs = series[["run_id", "commit"]].drop_duplicates("commit", keep="first")
    hit = sel.merge(runs, left_on="bad", right_on="commit")
    return hit[cols].drop_duplicates(["run_id", "first_bad"]).reset_index(drop=True)


# ---------------------------------------------------------------- compare

COMPARE_METRICS = ("tput_per_gpu", "interactivity_median", "ttft_ms_median", "tpot_ms_median", "e2el_ms_median")


def delta_table(a: pd.DataFrame, b: pd.DataFrame, metrics=COMPARE_METRICS) -> pd.DataFrame:
    """Per-concurrency values of A and B and the change B - A in percent (A is the baseline)."""
    merged = a.set_index("concurrency")[list(metrics)].join(
        b.set_index("concurrency")[list(metrics)], how="inner", lsuffix=" A", rsuffix=" B")
    out = pd.DataFrame(index=merged.index)
    for m in metrics:
        out[f"{m} A"] = merged[f"{m} A"]
        out[f"{m} B"] = merged[f"{m} B"]
        out[f"{m} Δ%"] = (merged[f"{m} B"] / merged[f"{m} A"] - 1.0) * 100.0
    return out.reset_index().sort_values("concurrency").reset_index(drop=True)


def compare_frontiers(a: pd.DataFrame, b: pd.DataFrame, x: str = "interactivity_median",
                      y: str = "tput_per_gpu"):
    """A's and B's frontiers compared at matched interactivity (k2bench.harness.analysis.pareto)."""
    from k2bench.harness.analysis.pareto import compare_frontiers as compare

    return compare(a[x].to_numpy(float), a[y].to_numpy(float), b[x].to_numpy(float), b[y].to_numpy(float))


def matched_interactivity(a: pd.DataFrame, b: pd.DataFrame, x: str = "interactivity_median",
                          y: str = "tput_per_gpu", comparison=None) -> pd.DataFrame:
    """At each of A's frontier levels that B's frontier also reaches, both throughputs (B's
    interpolated along its frontier, never extrapolated) and the change in percent.

    ``comparison``: compare_frontiers(a, b, x, y) when the caller already has it."""
    result = comparison if comparison is not None else compare_frontiers(a, b, x, y)
    conc = dict(zip(a[x].astype(float), a["concurrency"], strict=True))
    rows = [{"concurrency A": int(conc[m["interactivity"]]) if m["interactivity"] in conc else None,
             x: m["interactivity"], f"{y} A": m["baseline"], f"{y} B": m["candidate"],
             "Δ%": (m["ratio"] - 1.0) * 100.0} for m in result.matched]
    return pd.DataFrame(rows, columns=["concurrency A", x, f"{y} A", f"{y} B", "Δ%"])


def run_label(row) -> str:
    commit = str(row.get("commit") or "")[:8] or "no-commit"
    when = pd.Timestamp(row["started_at"]).strftime("%Y-%m-%d %H:%M") if _present(row.get("started_at")) else ""
    return f"#{row['run_id']} · {commit} · {row.get('branch') or '-'} · {row.get('engine')} · {when}"


def runs_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs that have at least one finished level, newest first, for pickers."""
    out = runs[runs["levels"] > 0].sort_values(["started_at", "run_id"], ascending=False)
    return out.reset_index(drop=True)


# ---------------------------------------------------------------- accuracy


def accuracy_badges(evals: dict[int, list[dict]], models: dict[int, str]) -> dict[int, str]:
    """{run id: "✅ tiny-arith 0.968"} per run with evaluations: ✅ at or above the task's threshold for
    the run's model (harness/eval/thresholds.toml), ❌ below it, no mark where no threshold is set."""
    from k2bench.harness.eval.gate import load_thresholds, threshold_for

    thresholds = load_thresholds()
    out = {}
    for run_id, evs in evals.items():
        parts = []
        for e in evs:
            thr = threshold_for(e["task"], models.get(run_id, ""), thresholds)
            mark = "" if thr is None else ("✅ " if e["value"] >= thr else "❌ ")
            parts.append(f"{mark}{e['task']} {e['value']:.3f}")
        out[run_id] = "; ".join(parts)
    return out


def with_accuracy(table: pd.DataFrame, badges: dict[int, str]) -> pd.DataFrame:
    """The table with an ``accuracy`` column from its rows' run_id (empty where a run has no evaluation)."""
    if "run_id" not in table.columns:
        return table
    return table.assign(accuracy=[badges.get(int(r), "") if pd.notna(r) else "" for r in table["run_id"]])

