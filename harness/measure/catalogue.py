"""The metric catalogue: every per-level metric declared once, with what each reader needs, and the
one home of presentation: labels, units and decimals of every field shown to a user.

Metrics compute it (k2bench.harness.measure.metrics), the gate judges it and the change-point scan
follows it (analysis), `k2bench show` and the dashboard print and plot it. Each of them reads
label, unit, direction, display decimals and the per-request sample from here, so a metric is
never described twice. The stored fields that are not metrics (a level's concurrency, duration,
failures; a run's start) are shown with the headers and decimals of ``FIELDS``; the schema
(k2bench.harness.record.schema) declares their types, checks and columns and says nothing of how they look.

Repeated trials of one level (``sweep --trials K``) are reduced to one value per run with the
**median**, everywhere (``over_trials``). The median keeps one disturbed trial (a noisy
neighbour, a server hiccup) from dragging the run's figure, it is what the dashboard always
showed, and with one or two trials it equals the mean, so single-trial histories do not move.
The gate used the mean before: three trials 100, 100, 40 read as a 20% drop there and as no
change on the dashboard; now both read 100. The price, under purely Gaussian noise, is a less
efficient estimate from three trials: bench/regress_bench.py (1000 comparisons per cell, 5 baseline
runs, 3 trials) detects a 10% step 74% of the time at 3% CV (86% with the mean) and 28% at 5% CV
(37%); false positives stay at or below 0.1%.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

LATENCY_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
STAT_KEYS = ("mean", "median", "std", "p90", "p99", "p99.9")
INTERACTIVITY_KEYS = ("median", "p90", "p99")
# the server-side time split (k2bench.harness.telemetry.server_split): its phases and their statistics
SERVER_PHASES = ("queue", "prefill", "decode", "inference")
SPLIT_KEYS = ("mean", "median", "p99")

# Per-request sample rules (Store.requests_frame columns, or a rule computed from them) for the
# gate's Mann-Whitney test: the sample has to move the same way as the metric.
# "slo_good" is 1 for a request that met the comparison's SLO, else 0 (failed requests included).
SAMPLE_RULES = ("output_rate", "inv_output_rate", "inv_tpot", "ttft_ms", "tpot_ms", "e2el_ms", "slo_good", "hit_share")

TRIAL_AGGREGATION = "median"


@dataclass(frozen=True)
class Metric:
    column: str  # name: the column of Store.points_frame
    label: str  # long, for chart axes and pickers ("TTFT median (ms)")
    short: str  # for tables and the gate's report ("TTFT p50")
    unit: str
    higher_is_better: bool
    decimals: int = 1  # shown in tables
    sample: str | None = None  # per-request sample rule (SAMPLE_RULES); None: no per-request test
    gate: bool = False  # judged by the regression gate and scanned for change points
    table: bool = False  # a column of the per-level tables (`k2bench show`, the dashboard's run page)

    @property
    def header(self) -> str:
        """Table header: the short label, with the unit unless it already names it."""
        return self.short if self.unit in self.short else f"{self.short} {self.unit}"

    def format(self, value) -> str:
        return "-" if value is None else f"{value:,.{self.decimals}f}"


@dataclass(frozen=True)
class Field:
    """How a stored field that is not a metric is shown (a level's duration, a run's start, ...)."""

    column: str  # the field's column (Store.points_frame or a run column)
    short: str  # table header
    label: str  # long, for tooltips
    unit: str = ""
    decimals: int = 0  # numbers: places shown in tables

    @property
    def header(self) -> str:
        return self.short if not self.unit or self.unit in self.short else f"{self.short} {self.unit}"

    def format(self, value) -> str:
        return "-" if value is None else f"{value:,.{self.decimals}f}"


# Every non-metric field a table shows. Per-level tables (`k2bench show`, a sweep's end, the dashboard's
# run page) show the LEVEL_TABLE_FIELDS as number columns beside the TABLE_METRICS.
FIELDS: dict[str, Field] = {f.column: f for f in (
    Field("concurrency", "conc", "Concurrency (requests in flight; for a rate level, the cap on them)"),
    Field("mode", "mode", "Level kind: closed (N in flight) or rate (sent on a schedule)"),
    Field("rate", "rate", "Requests/s a rate level asked for (inf: all at once)", "req/s", decimals=2),
    Field("level", "level", "The level: cN for N in flight (closed loop), rR/s for a rate level"),
    Field("trial", "trial", "Repeat of the level"),
    Field("duration_s", "duration", "Duration: first send to last finish (s)", "s", decimals=1),
    Field("failed", "failed", "Failed requests (of those measured)"),
    Field("osl_mismatches", "OSL mismatches", "Requests whose output length differed from the OSL asked for"),
    Field("valid", "valid", "The level counts (frontiers, the gate and change points)"),
    Field("invalid_reason", "why invalid", "Why the level does not count"),
    Field("config", "configuration", "Engine, model, hardware, GPUs and workload"),
    Field("run_id", "run", "Run id"),
    Field("started_at", "started (UTC)", "Start of the run, UTC"),
    Field("slo", "SLO", "The SLO levels are judged against (bounds in ms)"),
    Field("slo_met", "met SLO", "Measured requests that met the SLO"),
    Field("p_value", "p-value", "p-value of the comparison"),
    Field("rel_change", "change", "Relative change"),
    Field("first_bad", "culprit", "First bad commit"),
    Field("subject", "subject", "Commit subject"),
    Field("good", "good end", "Last good commit"),
    Field("bad", "bad end", "First bad commit of the range"),
)}
LEVEL_TABLE_FIELDS: tuple[Field, ...] = (FIELDS["duration_s"],)
# the gap between the client's and the server's TTFT (means): the way to the server and back, and the client
TTFT_GAP = Field("ttft_gap_ms", "client - server", "Client TTFT mean - server TTFT (network and client)", "ms",
                 decimals=1)


def stat_column(group: str, key: str) -> str:
    """Column of one statistic of a nested group, e.g. ttft_ms_p99_9."""
    return f"{group}_{key.replace('.', '_')}"


def _stat_label(key: str) -> str:
    return "p50" if key == "median" else key


def _catalogue() -> tuple[Metric, ...]:
    tput = "tok/s/GPU"
    out = [
        Metric("tput_per_gpu", f"Throughput ({tput})", tput, tput, True, sample="output_rate", gate=True,
               table=True),
        Metric("output_tput_per_gpu", f"Output throughput ({tput})", f"output {tput}", tput, True,
               sample="output_rate", table=True),
        Metric("input_tput_per_gpu", f"Input throughput ({tput})", f"input {tput}", tput, True),
    ]
    for key in INTERACTIVITY_KEYS:
        suffix = "" if key == "median" else f" {key}"
        out.append(Metric(stat_column("interactivity", key), f"Interactivity{suffix} (tok/s/user)",
                          f"tok/s/user{suffix}", "tok/s/user", True, sample="inv_tpot",
                          gate=key == "median", table=key == "median"))
    names = {"ttft_ms": ("TTFT", "TTFT"), "tpot_ms": ("TPOT", "TPOT"), "itl_ms": ("ITL", "ITL"),
             "e2el_ms": ("E2E latency", "E2EL")}  # (long, short)
    gated = {("ttft_ms", "median"), ("ttft_ms", "p99"), ("tpot_ms", "median"), ("tpot_ms", "p99"),
             ("e2el_ms", "median"), ("e2el_ms", "p99")}
    shown = {("ttft_ms", "median"), ("ttft_ms", "p99"), ("tpot_ms", "median"), ("itl_ms", "p99"),
             ("e2el_ms", "median")}
    for group, (name, short_name) in names.items():
        # itl has no per-request sample (gaps are pooled); a spread (std) does not move with a request's value
        sample = None if group == "itl_ms" else group
        for key in STAT_KEYS:
            out.append(Metric(stat_column(group, key), f"{name} {key} (ms)", f"{short_name} {_stat_label(key)}",
                              "ms", False,
                              decimals=2 if group in ("tpot_ms", "itl_ms") else 1,
                              sample=None if key == "std" else sample,
                              gate=(group, key) in gated, table=(group, key) in shown))
    # over the steady-state window only (k2bench.harness.measure.steady): less start-up and drain, less
    # run-to-run noise at high concurrency. No per-request sample (the window cuts requests); trials and
    # history judge them, and the gate may be pointed at them.
    out += [
        Metric("steady_tput_per_gpu", f"Steady-state throughput ({tput})", f"steady {tput}", tput, True),
        Metric("steady_output_tput_per_gpu", f"Steady-state output throughput ({tput})", f"steady output {tput}",
               tput, True),
    ]
    for group, name in (("steady_tpot_ms", "TPOT"), ("steady_itl_ms", "ITL")):
        for key in ("median", "p90", "p99"):
            out.append(Metric(stat_column(group, key), f"Steady-state {name} {key} (ms)",
                              f"steady {name} {_stat_label(key)}", "ms", False, decimals=2))
    # the client's own load (k2bench.harness.load.selfmeasure): lower is better, but it judges the level's
    # validity, not the server
    out += [
        Metric("client_cpu", "Client CPU (fraction of one core)", "client CPU", "cores", False, decimals=2),
        Metric("client_lag_p99_ms", "Client event-loop lag p99 (ms)", "client lag p99", "ms", False, decimals=1),
    ]
    # what a level cost (k2bench.harness.telemetry). At one price, $/Mtok is inverse throughput, so a
    # request's time per output token moves with it. Energy is measured per window, not per request (a
    # request's time would miss a change in power), so J/token has no sample: trials and history judge it.
    out += [
        Metric("j_per_token", "Energy per token (J/token)", "J/token", "J/token", False, decimals=3, gate=True,
               table=True),
        Metric("tokens_per_j", "Tokens per joule", "tok/J", "tok/J", True, decimals=2),
        Metric("usd_per_mtok", "Cost per million tokens ($/Mtok)", "$/Mtok", "$/Mtok", False, decimals=3,
               sample="inv_output_rate", gate=True, table=True),
        Metric("usd_per_mtok_output", "Cost per million output tokens ($/Mtok)", "$/Mtok output", "$/Mtok", False,
               decimals=3, sample="inv_output_rate"),
        Metric("pct_roofline", "Share of the roofline (% of its tok/s/GPU)", "% roofline", "%", True, decimals=1,
               table=True),
        # k2bench.harness.measure.workload_metrics: None (not shown) for a server that reports no cache
        Metric("prefix_hit_rate", "Prefix-cache hit rate (cached / prompt tokens)", "hit rate", "", True,
               decimals=3, sample="hit_share", gate=True, table=True),
    ]
    # how well a rate level kept its schedule (k2bench.harness.load.openloop): the client's own figures,
    # judged by validity rather than by the gate; null for closed levels
    out += [
        Metric("achieved_rate", "Achieved rate (req/s)", "sent req/s", "req/s", True, decimals=2),
        Metric("send_lag_p50_ms", "Send lag median (ms)", "lag p50", "ms", False, decimals=2),
        Metric("send_lag_p99_ms", "Send lag p99 (ms)", "lag p99", "ms", False, decimals=2),
        Metric("queue_p50_ms", "Client queue time median (ms)", "queue p50", "ms", False, decimals=1),
        Metric("queue_p99_ms", "Client queue time p99 (ms)", "queue p99", "ms", False, decimals=1),
    ]
    # what the server itself timed (its histograms over the measured window): beside the client's TTFT,
    # not judged (the client's figures are); p50/p99 are off by at most a histogram bucket's width
    out.append(Metric("server_ttft_ms", "Server TTFT: queue + prefill, means (ms)", "server TTFT = queue + prefill",
                      "ms", False))
    for phase in SERVER_PHASES:
        for key in SPLIT_KEYS:
            out.append(Metric(stat_column(f"server_{phase}_ms", key), f"Server {phase} time {key} (ms)",
                              f"server {phase} {_stat_label(key)}", "ms", False))
    # speculative decoding: per level from the server's counters; a drop in acceptance is a regression
    out += [
        Metric("spec_accept_len", "Acceptance length (tokens per verification step)", "accept len", "tok/step",
               True, decimals=2, gate=True),
        Metric("spec_accept_rate", "Draft acceptance rate (accepted / drafted tokens)", "draft accept", "ratio",
               True, decimals=3, gate=True),
    ]
    # against the run's SLO (k2bench.harness.measure.slo); tables show them when a level has them
    # (SLO_TABLE_METRICS). Each request's sample is whether it met the SLO: at one level, more good
    # requests means more attainment and more goodput.
    out += [
        Metric("slo_attainment", "SLO attainment (share of requests that met the SLO)", "SLO attainment", "",
               True, decimals=3, sample="slo_good", gate=True),
        Metric("goodput_rps", "Goodput (requests that met the SLO per second)", "goodput req/s", "req/s", True,
               decimals=2, sample="slo_good", gate=True),
        Metric("goodput_per_gpu", f"Goodput ({tput} of requests that met the SLO)", f"goodput {tput}", tput, True,
               sample="slo_good", gate=True),
    ]
    return tuple(out)


CATALOGUE: tuple[Metric, ...] = _catalogue()
BY_COLUMN: dict[str, Metric] = {m.column: m for m in CATALOGUE}
# The server-side split table (`k2bench show`, the dashboard's run page), after the client's TTFT mean,
# the server's (queue + prefill) and their gap (TTFT_GAP): what the server timed and how it speculated.
SPLIT_TABLE: tuple[Metric, ...] = tuple(BY_COLUMN[c] for c in (
    "server_queue_ms_mean", "server_prefill_ms_mean", "server_queue_ms_p99", "server_prefill_ms_p99",
    "server_decode_ms_median", "server_inference_ms_median", "spec_accept_len", "spec_accept_rate"))
GATE_METRICS: tuple[Metric, ...] = tuple(m for m in CATALOGUE if m.gate)
TABLE_METRICS: tuple[Metric, ...] = tuple(m for m in CATALOGUE if m.table)
# the columns per-level tables add when they show a rate level
RATE_TABLE_METRICS: tuple[Metric, ...] = tuple(BY_COLUMN[c] for c in ("achieved_rate", "send_lag_p99_ms", "queue_p99_ms"))
SLO_TABLE_METRICS: tuple[Metric, ...] = tuple(BY_COLUMN[c] for c in ("goodput_rps", "goodput_per_gpu"))


def attainment_text(fraction: float | None, low: float | None, high: float | None) -> tuple[str, str]:
    """Attainment and its interval, as tables and hovers show them: ``("97.0%", "92.1-99.4")``."""
    if fraction is None:
        return "-", "-"
    interval = "-" if low is None or high is None else f"{100 * low:.1f}-{100 * high:.1f}"
    return f"{100 * fraction:.1f}%", interval


def over_trials(frame: pd.DataFrame, columns: Iterable[str], keys: Iterable[str] = ("run_id", "concurrency"),
                ) -> pd.DataFrame:
    """One row per ``keys`` group: each column reduced over trials with TRIAL_AGGREGATION."""
    import pandas as pd

    keys = list(keys)
    cols = [c for c in columns if c in frame.columns and c not in keys]
    values = frame[keys + cols].copy()
    # a column that is None in every row arrives as objects: make it numbers (NaN) first
    values[cols] = values[cols].apply(pd.to_numeric, errors="coerce")
    return values.groupby(keys, as_index=False)[cols].agg(TRIAL_AGGREGATION)
