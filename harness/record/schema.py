"""The one declaration of what a run, a level (point) and a request record hold.

Each field is declared once, below, with its Python type, its check (``kind``), whether an
imported document must carry it, its SQL column and its help text. Everything else is derived
from these classes: the k2bench.run JSON reader and writer (runjson), the ORM tables
(store.models), the DataFrames (store.frames) and the fingerprint's field list. How a field is
shown (header, unit, decimals) is presentation and lives in the catalogue
(k2bench.harness.measure.catalogue), never here. Adding a field is an edit here plus one Alembic migration.

The JSON document carries ``"schema": "k2bench.run/<SCHEMA_VERSION>"``. A change to the fields
bumps SCHEMA_VERSION and adds ``UPGRADES[old] = update_to_<old + 1>``, a function that turns a
document of version ``old`` into one of ``old + 1`` (asv's pattern); the reader applies the chain
to every older file, so files written before keep importing. A new optional field needs only the
bump and an upgrade that returns the document unchanged.

Kinds (a trailing ``?`` allows null): str, int, pos_int, nonneg_int, float (finite), ratio (0..1),
bool, dict, json (object, list or string), mode (one of MODES), rate (positive requests/s or
inf, written "inf" in JSON), str_list, int_list, time (ISO-8601, stored as naive
UTC), status (one of RUN_STATUSES), stats (an object of the statistics in ``keys``, one Float
column each, named ``<field>_<key>``).

The in-memory record the load generator fills is k2bench.harness.load.records.RequestRecord (absolute
stamps); ``Request`` here is its stored and exported form (stamps as deltas).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, Integer, String, Text
from sqlalchemy.types import TypeEngine

from k2bench.errors import UserError
from k2bench.harness.measure.catalogue import INTERACTIVITY_KEYS, SPLIT_KEYS, STAT_KEYS, stat_column

SCHEMA_PREFIX = "k2bench.run/"
SCHEMA_VERSION = 3


def update_to_2(doc: dict) -> dict:
    """Version 2 lets a level's num_prompts, completed and failed be null (a result imported from a tool
    that does not count requests), adds a level's validity (an older level counts when none of its
    requests failed, or when it has no counts), per-level energy, cost, server metrics and their flat
    figures (j_per_token, tokens_per_j, usd_per_mtok, usd_per_mtok_output, pct_roofline; absent: not
    measured), and the optional top-level ``evals`` list (accuracy evaluations; a version-1 document
    has none)."""
    for point in doc.get("points") or []:
        if isinstance(point, dict) and "valid" not in point:
            point["valid"] = point.get("failed") in (0, None)
            point["invalid_reason"] = None if point["valid"] else "requests failed (recorded before validity was)"
    doc.setdefault("evals", [])
    return doc


def update_to_3(doc: dict) -> dict:
    """Version 3 adds, all optional: open-loop rate levels (a level's ``mode`` and ``rate``, ``inf`` as a
    string; a level without them is a closed loop, as every version-2 level is) with their send lag, queue
    time and achieved rate, and each request's ``intended_ns``/``queue_ns``; the run's ``arrival``,
    ``workload_def``, ``slo`` and ``profile``; a level's SLO attainment and goodput, prefix-cache hit rate,
    per-turn figures, the server's time split and speculative acceptance, the client's own load and the
    steady state; a request's ``cached_tokens``, ``session`` and ``turn``. Nothing of version 2 changes
    meaning, so the upgrade changes nothing; the number tells an older k2bench that it cannot read the
    document rather than letting it refuse an unknown field."""
    return doc


# UPGRADES[n] turns a version-n document into version n + 1.
UPGRADES: dict[int, Callable[[dict], dict]] = {1: update_to_2, 2: update_to_3}

RUN_STATUSES = ("running", "complete", "partial", "failed")
NUMERIC_KINDS = ("int", "pos_int", "nonneg_int", "float", "ratio")


@dataclass(frozen=True)
class Spec:
    """How one field is checked and stored (how it is shown: k2bench.harness.measure.catalogue)."""

    kind: str
    sql: TypeEngine | None  # None: not a plain column (the store keeps it another way)
    help: str
    required: bool = False  # an imported document must carry it
    nullable: bool = True  # the column may hold NULL (``default`` fills an absent value)
    default: object = None  # the value when the document leaves it out or null
    column: str | None = None  # column name, when it differs from the field name
    index: bool = False
    fingerprint: bool = False  # part of the configuration fingerprint (see k2bench.harness.record.fingerprint)
    keys: tuple[str, ...] = ()  # kind "stats": the statistics
    name: str = ""  # filled from the class attribute

    @property
    def base(self) -> str:
        return self.kind.rstrip("?")

    @property
    def column_name(self) -> str:
        return self.column or self.name

    @property
    def numeric(self) -> bool:
        return self.base in NUMERIC_KINDS

    def columns(self) -> list[str]:
        """The column(s) this field occupies (none when sql is None)."""
        if self.sql is None:
            return []
        if self.base == "stats":
            return [stat_column(self.name, k) for k in self.keys]
        return [self.column_name]


def col(kind: str, sql: TypeEngine | None, help: str, **options) -> dataclasses.Field:  # noqa: A002
    return dataclasses.field(default=None, metadata={"spec": Spec(kind, sql, help, **options)})


def _stats(help: str, keys: tuple[str, ...] = STAT_KEYS) -> dataclasses.Field:  # noqa: A002
    return col("stats", Float(), help, keys=keys)


@dataclass
class Run:
    """One invocation of a benchmark against one server configuration."""

    id: int | None = col("int?", None, "database id (assigned by the store; ignored on import)")
    commit: str | None = col("str?", String(64), "commit of the code under test")
    branch: str | None = col("str?", String(255), "branch of the code under test")
    engine: str = col("str", String(255), "serving engine (atom, vllm, sglang, k2bench, ...)",
                      required=True, nullable=False, fingerprint=True)
    engine_version: str | None = col("str?", String(255), "engine version", fingerprint=True)
    engine_flags: dict | list | str | None = col("json?", JSON(), "engine flags as launched", fingerprint=True)
    server_command: str | None = col("str?", Text(), "the server's command line")
    model: str = col("str", String(512), "model name or path", required=True, nullable=False, fingerprint=True)
    precision: str | None = col("str?", String(64), "weight precision (mxfp4, bf16, ...)", fingerprint=True)
    hardware: str | None = col("str?", String(255), "accelerator model", fingerprint=True)
    num_gpus: int = col("pos_int", Integer(), "GPUs of the server under test (tp x pp x dp)",
                        required=True, nullable=False, fingerprint=True)
    tp: int | None = col("pos_int?", Integer(), "tensor-parallel size", fingerprint=True)
    workload: str | None = col("str?", String(255), "workload name (8k1k, ...)", fingerprint=True)
    isl: int | None = col("pos_int?", Integer(), "input sequence length, tokens", fingerprint=True)
    osl: int | None = col("pos_int?", Integer(), "output sequence length, tokens", fingerprint=True)
    range_ratio: float | None = col("ratio?", Float(), "allowed length spread (1.0 = exact lengths)",
                                    fingerprint=True)
    workload_def: dict | None = col("dict?", JSON(), "the workload's definition beyond name, lengths and ratio "
                                    "(source, dataset file and its hash, prefixes, turns, trace, seed); null for "
                                    "random fixed-length prompts", fingerprint=True)
    fingerprint: str | None = col("str?", String(64), "configuration hash (computed when absent)",
                                  nullable=False, index=True)
    started_at: str = col("time", DateTime(), "start, UTC", required=True, nullable=False, index=True)
    finished_at: str | None = col("time?", DateTime(), "end, UTC")
    status: str = col("status", String(16), "running, complete, partial or failed",
                      required=True, nullable=False, index=True)
    tags: dict | None = col("dict?", JSON(), "free-form labels")
    trials: int | None = col("pos_int?", Integer(), "repeats of each level", nullable=False, default=1)
    client: dict | None = col("dict?", JSON(), "the measuring client (k2bench version, host)")
    notes: str | None = col("str?", Text(), "free text")
    extra: dict | None = col("dict?", JSON(), "free-form data")
    arrival: dict | None = col("dict?", JSON(), "rate levels' schedule: burstiness, max_inflight, ramp_up_s, "
                               "duration_s, seed (null for a closed-loop run)", fingerprint=True)
    profile: dict | None = col("dict?", JSON(), "the profiled pass (--profile-level): concurrency, requests, "
                               "completed, the server's trace path and kernel-time summary, or why there is none")
    slo: str | None = col("str?", String(255), "the SLO its levels' attainment and goodput were computed "
                          "against (k2bench.harness.measure.slo; null: none given)")


@dataclass
class Point:
    """One level: a concurrency (and trial) measured after warmup, summarised."""

    concurrency: int = col("pos_int", Integer(), "closed: requests in flight; rate: the cap on requests in "
                           "flight (--max-inflight, else the level's request count)", required=True, nullable=False)
    trial: int | None = col("nonneg_int?", Integer(), "repeat number", nullable=False, default=0)
    # the level's kind: a closed loop (N in flight) or requests sent on a schedule at a rate
    mode: str | None = col("mode?", String(16), "closed (N in flight) or rate (open loop)", nullable=False,
                           default="closed")
    rate: float | None = col("rate?", Float(), "rate levels: requests/s asked for (inf: all at once, \"inf\" in "
                             "JSON); null for closed levels")
    # null only in results imported from a tool that does not report them (InferenceX), all three together
    num_prompts: int | None = col("nonneg_int?", Integer(), "measured requests", required=True)
    completed: int | None = col("nonneg_int?", Integer(), "successful requests", required=True)
    failed: int | None = col("nonneg_int?", Integer(), "failed requests", required=True)
    osl_mismatches: int | None = col("nonneg_int?", Integer(), "requests whose output length differed from OSL",
                                     nullable=False, default=0)
    errors: list[str] | None = col("str_list?", JSON(), "first error messages", default=[])
    duration_s: float | None = col("float?", Float(), "first send to last finish, s")
    input_tokens: int | None = col("nonneg_int?", BigInteger(), "input tokens of completed requests")
    output_tokens: int | None = col("nonneg_int?", BigInteger(), "output tokens of completed requests")
    tput_per_gpu: float | None = col("float?", Float(), "(input + output tokens) / duration / GPUs")
    output_tput_per_gpu: float | None = col("float?", Float(), "output tokens / duration / GPUs")
    input_tput_per_gpu: float | None = col("float?", Float(), "input tokens / duration / GPUs")
    extra: dict | None = col("dict?", JSON(), "free-form data")
    # validity (version 2): an invalid level is kept but left out of frontiers, the gate and change points
    valid: bool = col("bool", Boolean(), "the level counts (see k2bench.harness.measure.validity); absent: no request "
                      "failed", nullable=False)
    invalid_reason: str | None = col("str?", Text(), "why the level does not count (null when valid)")
    # v2: what the level cost and what the server saw (k2bench.harness.telemetry)
    energy: dict | None = col("dict?", JSON(), "GPU power and energy over the measured window: per-GPU power, "
                              "clocks, joules, power_valid and its reason, raw samples (null without GPU telemetry)")
    cost: dict | None = col("dict?", JSON(), "gpu_hour_usd, usd_per_mtok, usd_per_mtok_output, price_source "
                            "(null without a price)")
    server_metrics: dict | None = col("dict?", JSON(), "the server's /metrics over the measured window: counters "
                                      "(name -> delta), gauges (name -> {mean, max}), raw gauge series")
    j_per_token: float | None = col("float?", Float(), "joules per token (input + output); power_valid levels only")
    tokens_per_j: float | None = col("float?", Float(), "tokens (input + output) per joule; power_valid levels only")
    usd_per_mtok: float | None = col("float?", Float(), "US$ per million tokens (input + output) at gpu_hour_usd")
    usd_per_mtok_output: float | None = col("float?", Float(), "US$ per million output tokens at gpu_hour_usd")
    achieved_rate: float | None = col("float?", Float(), "rate levels: measured requests / s as actually sent, "
                                      "(n - 1) / (last send - first send)")
    send_lag_p50_ms: float | None = col("float?", Float(), "rate levels: median send lag (actual - intended send, "
                                        "less queue time), ms")
    send_lag_p99_ms: float | None = col("float?", Float(), "rate levels: p99 send lag, ms")
    queue_p50_ms: float | None = col("float?", Float(), "rate levels: median time a request waited for the "
                                     "in-flight cap, ms")
    queue_p99_ms: float | None = col("float?", Float(), "rate levels: p99 time a request waited for the "
                                     "in-flight cap, ms")
    pct_roofline: float | None = col("float?", Float(), "tok/s/GPU as a percentage of the roofline at this "
                                     "concurrency (run extra.roofline)")
    # what the server timed and how its speculation fared (k2bench.harness.telemetry.server_split); absent:
    # the server did not expose it. Statistics of a phase: mean (exact), median and p99 (within a bucket)
    server_ttft_ms: float | None = col("float?", Float(), "server TTFT = mean queue + mean prefill time, ms")
    server_queue_ms: dict | None = _stats("server queue time (queued to first scheduled), ms", SPLIT_KEYS)
    server_prefill_ms: dict | None = _stats("server prefill time (first scheduled to first token), ms", SPLIT_KEYS)
    server_decode_ms: dict | None = _stats("server decode time (first token to last token), ms", SPLIT_KEYS)
    server_inference_ms: dict | None = _stats("server inference time (first scheduled to last token), ms",
                                              SPLIT_KEYS)
    spec_accept_len: float | None = col("float?", Float(), "speculative decoding: tokens per verification step "
                                        "(1 + accepted / drafts)")
    spec_accept_rate: float | None = col("ratio?", Float(), "speculative decoding: accepted / drafted tokens")
    # against the run's SLO (k2bench.harness.measure.slo); null when the run has none
    slo_attainment: float | None = col("ratio?", Float(), "share of measured requests that met the SLO")
    slo_attainment_low: float | None = col("ratio?", Float(), "lower end of its 95% Clopper-Pearson interval")
    slo_attainment_high: float | None = col("ratio?", Float(), "upper end of its 95% Clopper-Pearson interval")
    slo_met: int | None = col("nonneg_int?", Integer(), "measured requests that met the SLO")
    goodput_rps: float | None = col("float?", Float(), "requests that met the SLO / duration, req/s")
    goodput_per_gpu: float | None = col("float?", Float(), "(input + output tokens of the requests that met "
                                        "the SLO) / duration / GPUs")
    prefix_hit_rate: float | None = col("ratio?", Float(), "prefix-cache hit rate over the measured window: "
                                        "cached / looked-up prompt tokens (server counters, else usage)")
    prefix_hit_source: str | None = col("str?", String(64), "where prefix_hit_rate came from: a counter pair, "
                                        "a gauge, or usage.prompt_tokens_details.cached_tokens")
    turns: dict | None = col("dict?", JSON(), "conversations: per turn (\"1\", \"2\", ...) its requests, "
                             "TTFT statistics, prompt tokens and cached tokens")
    interactivity: dict | None = _stats("1000 / TPOT percentile, tok/s/user", INTERACTIVITY_KEYS)
    ttft_ms: dict | None = _stats("time to first token, ms")
    tpot_ms: dict | None = _stats("time per output token after the first, ms")
    itl_ms: dict | None = _stats("gaps between token messages, ms")
    e2el_ms: dict | None = _stats("request sent to last token, ms")
    # the client's own load over the measured requests (k2bench.harness.load.selfmeasure); null: not measured
    client: dict | None = col("dict?", JSON(), "the client over the measured window: processes, cores_available, "
                              "cores_given, cpu_s, wall_s, cpu_cores, cpu_share, busy_max, lag_p50_ms, lag_p99_ms, "
                              "lag_max_ms, per_process")
    client_cpu: float | None = col("float?", Float(), "client CPU (user + system) as a fraction of one core")
    client_cpu_share: float | None = col("float?", Float(), "client CPU as a fraction of the cores it was given")
    client_lag_p99_ms: float | None = col("float?", Float(), "p99 event-loop lag of the client, ms (worst process)")
    # steady state (k2bench.harness.measure.steady): the window with >= 90% of the concurrency in flight
    steady: dict | None = col("dict?", JSON(), "steady-state window (fraction, threshold, start_s, end_s from the "
                              "first send) and one-second slices (t_s, output_tok_s, in_flight, tpot_ms)")
    steady_duration_s: float | None = col("float?", Float(), "length of the steady-state window, s")
    steady_tput_per_gpu: float | None = col("float?", Float(), "(input + output tokens) over the steady-state "
                                            "window / window / GPUs")
    steady_output_tput_per_gpu: float | None = col("float?", Float(), "output tokens over the steady-state "
                                                   "window / window / GPUs")
    steady_tpot_ms: dict | None = _stats("TPOT of requests sent and finished in the steady-state window, ms")
    steady_itl_ms: dict | None = _stats("gaps between token messages inside the steady-state window, ms")


@dataclass
class Request:
    """One request's raw stamps, as stored and exported (k2bench.harness.load.records holds the live form)."""

    concurrency: int = col("pos_int", Integer(), "its level's concurrency", required=True, nullable=False)
    trial: int | None = col("nonneg_int?", Integer(), "its level's trial", nullable=False, default=0)
    mode: str | None = col("mode?", String(16), "its level's mode", nullable=False, default="closed")
    rate: float | None = col("rate?", Float(), "its level's rate (null for closed levels)")
    index: int = col("nonneg_int", Integer(), "position in its level (warmup included)", required=True,
                     nullable=False, column="idx")
    warmup: bool = col("bool", Boolean(), "a warmup request (not measured)", required=True, nullable=False)
    requested_input_tokens: int = col("nonneg_int", Integer(), "prompt length asked for", required=True,
                                      nullable=False)
    requested_output_tokens: int = col("nonneg_int", Integer(), "max_tokens asked for", required=True,
                                       nullable=False)
    send_ns: int = col("int", BigInteger(), "client monotonic ns before sending", required=True, nullable=False)
    end_ns: int | None = col("int?", BigInteger(), "stream end, monotonic ns")
    intended_ns: int | None = col("int?", BigInteger(), "rate levels: when the schedule said to send it, "
                                  "monotonic ns (send_ns is when it was sent)")
    queue_ns: int | None = col("nonneg_int?", BigInteger(), "rate levels: ns it waited for the in-flight cap")
    token_delta_ns: list[int] = col("int_list", None, "ns from send to the first token message, then between "
                                    "messages (stored compressed, see store.codec)", required=True)
    prompt_tokens: int | None = col("nonneg_int?", Integer(), "server's usage.prompt_tokens")
    output_tokens: int | None = col("nonneg_int?", Integer(), "server's usage.completion_tokens")
    success: bool = col("bool", Boolean(), "completed without error", required=True, nullable=False)
    error: str | None = col("str?", Text(), "first error message")
    cached_tokens: int | None = col("nonneg_int?", Integer(), "server's usage.prompt_tokens_details.cached_tokens")
    session: int | None = col("nonneg_int?", Integer(), "conversations: the session (user) of the request")
    turn: int | None = col("pos_int?", Integer(), "conversations: the request's turn in its session, from 1")


@dataclass
class Eval:
    """One accuracy evaluation run on the run's server (k2bench eval / sweep --eval): the top-level
    ``evals`` list of the document (schema version 2)."""

    task: str = col("str", String(64), "evaluation task (tiny-arith, gsm8k, ...)", required=True, nullable=False)
    metric: str = col("str", String(64), "lm-eval metric (exact_match)", required=True, nullable=False)
    value: float = col("ratio", Float(), "the metric over all items, 0..1", required=True, nullable=False)
    stderr: float | None = col("float?", Float(), "standard error of value")
    n: int = col("pos_int", Integer(), "items evaluated", required=True, nullable=False)
    concurrency: int | None = col("pos_int?", Integer(), "requests in flight during the evaluation")
    items: list | None = col("json?", JSON(), "per-item scores in task order (the gate's two-proportion test)")


def specs(cls: type) -> tuple[Spec, ...]:
    return tuple(dataclasses.replace(f.metadata["spec"], name=f.name) for f in dataclasses.fields(cls))


RUN: tuple[Spec, ...] = specs(Run)
POINT: tuple[Spec, ...] = specs(Point)
REQUEST: tuple[Spec, ...] = specs(Request)
EVAL: tuple[Spec, ...] = specs(Eval)


FINGERPRINT_FIELDS: tuple[str, ...] = tuple(s.name for s in RUN if s.fingerprint)
# Short run fields (no free text or JSON): what frames join to each level and tables list.
RUN_SUMMARY_FIELDS: tuple[str, ...] = tuple(
    s.name for s in RUN if s.sql is not None and not isinstance(s.sql, (JSON, Text)))
LEVEL_KEYS = ("mode", "rate", "concurrency", "trial")
# What tells one series of levels from another across runs (LEVEL_KEYS less the trial).
SERIES_KEYS = ("mode", "rate", "concurrency")
MODES = ("closed", "rate")


def level_key(obj) -> tuple:
    """(mode, rate, concurrency, trial) of a point or request (a dict or a row); old data is closed."""
    get = obj.get if isinstance(obj, dict) else (lambda k, d=None: getattr(obj, k, d))
    return (get("mode") or "closed", get("rate"), get("concurrency"), get("trial") or 0)


def level_label(mode: str | None, rate: float | None, concurrency: int) -> str:
    """How tables name a level: "c8" for a closed level, "r2.5/s" (or "r inf") for a rate level."""
    if (mode or "closed") == "closed":
        return f"c{concurrency}"
    return "r inf" if rate is not None and rate == float("inf") else f"r{rate:g}/s"
# Per-level numbers stored as plain columns (the levels' own counts and rates).
LEVEL_NUMBERS: tuple[str, ...] = tuple(s.name for s in POINT if s.numeric and s.name not in LEVEL_KEYS)
# Flat columns of a level: what Store.points_frame returns besides the run fields.
POINT_COLUMNS: tuple[str, ...] = tuple(
    c for s in POINT if s.sql is not None and not isinstance(s.sql, JSON) for c in s.columns())


# ---------------------------------------------------------------- times


def format_time(dt: datetime | None) -> str | None:
    """Canonical UTC ISO-8601 text, e.g. 2026-11-29T18:57:30.000000Z."""
    if dt is None:
        return None
    if dt.tzinfo is not None:
        dt = dt.astimezone(timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str, where: str = "time") -> datetime:
    """ISO-8601 text -> aware UTC datetime (text without an offset is taken as UTC)."""
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except (TypeError, ValueError):
        raise UserError(f"{where}: not an ISO-8601 time: {text!r}") from None
    if dt.tzinfo is None:
        return dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc)


# ---------------------------------------------------------------- to and from columns


def to_columns(fields: tuple[Spec, ...], obj: dict) -> dict:
    """A validated object -> {column: value} for every plain column of its fields."""
    out = {}
    for s in fields:
        if s.sql is None:
            continue
        value = obj.get(s.name)
        if s.base == "stats":
            value = value or {}
            out.update({stat_column(s.name, k): value.get(k) for k in s.keys})
        elif s.base == "time":
            out[s.column_name] = None if value is None else parse_time(value).replace(tzinfo=None)
        else:
            out[s.column_name] = value
    return out


def from_columns(fields: tuple[Spec, ...], row) -> dict:
    """An ORM row (attributes named as columns) -> the object's plain-column fields."""
    out = {}
    for s in fields:
        if s.sql is None:
            continue
        if s.base == "stats":
            out[s.name] = {k: getattr(row, stat_column(s.name, k)) for k in s.keys}
        elif s.base == "time":
            value = getattr(row, s.column_name)
            out[s.name] = None if value is None else format_time(value.replace(tzinfo=timezone.utc))
        else:
            out[s.name] = getattr(row, s.column_name)
    return out
