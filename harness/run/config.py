"""What a sweep is asked: `SweepConfig`, filled by `settings.build` from flags and suite files (tests build it
directly). Its own module so that the sweep (`run/sweep.py`) and the running of one level
(`run/level_run.py`) both read it without importing each other."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from k2bench.harness.measure.validity import ValidityRules
from k2bench.harness.plan import estimate, settings
from k2bench.harness.run import level_work
from k2bench.harness.telemetry.level import TelemetryConfig
from k2bench.workloads.loader import Workload


@dataclass
class SweepConfig:
    """Everything a sweep needs; `settings.build` fills it from flags and suite files, tests build it
    directly. The defaults and checks of its fields are declared in `settings`."""

    levels: list[int]
    workload: Workload
    url: str | None = None
    engine: str | None = None
    server_cmd: str | None = None  # launch this command line instead of a recipe (the custom recipe)
    server_cwd: str | None = None  # where the launched server runs (a backfilled commit's worktree)
    model: str | None = None
    tp: int = settings.default("tp")
    num_prompts: int | None = None  # per level; default 10 x concurrency
    warmup: int | None = None  # per level; default 2 x concurrency
    num_prompts_x: float | None = None  # per level as a multiple of the concurrency ("--num-prompts 1x")
    warmup_x: float | None = None  # likewise for --warmup
    trials: int = settings.default("trials")
    db: str | None = None
    json_path: str | None = None
    commit: str | None = None
    branch: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    gpus: int | None = None
    timeout_s: float = settings.default("timeout")
    server_args: str | None = None
    precision: str | None = None
    hardware: str | None = None
    ready_timeout_s: float | None = None
    log_dir: str = settings.default("log_dir")
    api_key: str | None = None
    notes: str | None = None
    rules: ValidityRules = field(default_factory=ValidityRules)
    level_timeout_s: float | None = None  # bounds a whole level, warmup included
    command_line: list[str] | None = None  # the k2bench arguments, for the reproducible record
    evals: list[tuple[str, int | None]] = field(default_factory=list)  # (task, concurrency or None: highest level)
    eval_data: str | None = None  # --data of the evaluations (GSM8K-format JSONL)
    eval_limit: int | None = None  # only the first N items of each evaluation
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)  # GPU power, server metrics, price
    slo: str | None = None  # SLO text (k2bench.harness.measure.slo): each level's attainment and goodput
    client_procs: str = settings.default("client_procs")  # worker processes per level: "N" or "auto"
    trace_time_scale: float = settings.default("trace_time_scale")  # --trace only: scales the trace's gaps
    rates: list[float] = field(default_factory=list)  # open-loop levels, requests/s (inf: all at once)
    burstiness: float = settings.default("burstiness")  # gamma shape of the gaps (1 = Poisson)
    max_inflight: int | None = None  # rate levels: cap on requests in flight
    ramp_up_s: float = settings.default("ramp_up")  # rate levels: the rate grows linearly over the first S seconds (warmup)
    duration_s: float | None = None  # rate levels: measured sending time; num_prompts (if given) caps it
    profile_level: str | None = None  # C[:N]: profile N requests at concurrency C (an extra pass)

    @classmethod
    def from_settings(cls, given: Mapping[str, object], base: SweepConfig | None = None,
                      **context: object) -> SweepConfig:
        """The config of ``given`` settings (`settings.from_args` / `from_table`) over ``base``, which
        defaults to the declared defaults; checked."""
        if base is None:
            from k2bench.workloads.loader import resolve

            base = settings.apply(cls(levels=[1], workload=resolve(None, None, None)), settings.defaults())
        return settings.apply(base, given, **context)

    def prompts_for(self, conc: int) -> int:
        if self.num_prompts is not None:
            return self.num_prompts
        return max(1, round((10 if self.num_prompts_x is None else self.num_prompts_x) * conc))

    def warmup_for(self, conc: int) -> int:
        if self.warmup is not None:
            return self.warmup
        return round((2 if self.warmup_x is None else self.warmup_x) * conc)

    def rate_count(self, rate: float, warmup: bool = False) -> int | None:
        """Requests of a rate level (measured, or warmup): a count, or K x the rate (K seconds' worth; for
        an infinite rate K x --max-inflight). None: the measured count is left to --duration."""
        n, x, k = (self.warmup, self.warmup_x, 2) if warmup else (self.num_prompts, self.num_prompts_x, 10)
        if n is not None:
            return n
        if x is None and self.duration_s is not None and not warmup:
            return None
        per = self.max_inflight if math.isinf(rate) else rate
        return max(0 if warmup else 1, round((k if x is None else x) * (per or 1)))

    def arrival(self) -> dict | None:
        """What the run records (and fingerprints) about its rate levels' schedule; None without any."""
        if not self.rates:
            return None
        return {"burstiness": self.burstiness, "max_inflight": self.max_inflight, "ramp_up_s": self.ramp_up_s,
                "duration_s": self.duration_s, "seed": self.workload.seed}

    def planned_levels(self) -> list[estimate.Level]:
        if self.workload.source == "trace":  # one level per trial: the whole trace
            return [estimate.Level(1, len(level_work.trace_offsets(self.workload)))] * self.trials
        closed = [estimate.Level(c, self.prompts_for(c) + self.warmup_for(c)) for c in self.levels]
        rate = [estimate.Level(self.max_inflight or 1, (self.rate_count(r) or round(r * (self.duration_s or 0)))
                               + (self.rate_count(r, warmup=True) or 0)) for r in self.rates if math.isfinite(r)]
        return [lv for lv in closed + rate for _ in range(self.trials)]

    def validate(self) -> None:
        """Every check, in one place: the declaration of the settings (`settings.validate`)."""
        settings.validate(self)
