"""The capacity search: the highest load whose SLO attainment meets a target, in one run.

A serving team asks "how much load can this build take before users notice?". The answer is a
boundary on one load axis (requests in flight), found as a root is found on a line: bracket it by
doubling from a start until a probe misses the target, then bisect the bracket until its ends are
within a tolerance or the probes are spent. Each probe is one stored level of one run: `Search` feeds
the sweep one level at a time, and the sweep runs it as it runs any level (`level_run.LevelRunner`).
A probe is judged by the SLO attainment the sweep stores with it (k2bench.harness.measure.slo: the
share of its measured requests that met every bound). Bracketing probes are short; once the boundary
is bracketed, probes are twice as long, because only there does a verdict decide the answer.

The result (capacity, goodput at capacity, the probes on either side with their attainment
intervals) goes into the run's ``extra.capacity``, where `regress` and the dashboard read it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from k2bench.errors import UserError
from k2bench.harness.measure import slo as slo_mod
from k2bench.harness.run.config import SweepConfig
from k2bench.harness.run.level_run import Level
from k2bench.harness.run.sweep import LevelEvents, SweepResult, run_sweep

BY = ("concurrency", "rate")  # the load axes a search can walk: requests in flight, requests per second
DEFAULT_START = {"concurrency": 4, "rate": 1.0}  # the design card's lowest level; one request a second
UNIT = {"concurrency": "requests in flight", "rate": "requests/s"}
BRACKET_WAVES = 4  # measured requests of a bracketing probe, as a multiple of its concurrency
BRACKET_SECONDS = 5  # a bracketing rate probe: this many seconds' worth of requests
MIN_PROBE_REQUESTS = 20  # so that one probe's attainment interval means something
NEAR_FACTOR = 2  # probes once the boundary is bracketed are this many times longer


@dataclass(frozen=True)
class SearchSettings:
    """What the search is asked (the flags of `k2bench capacity`); checked by `validate`."""

    slo: slo_mod.Slo
    by: str = "concurrency"
    target: float = 0.99
    max_probes: int = 8
    start: float | None = None  # the first probe's load (default DEFAULT_START[by])
    tolerance: float = 0.1  # stop when the bracket's upper end is within this fraction of its lower end

    def validate(self) -> None:
        if self.by not in BY:
            raise UserError(f"--by must be one of {', '.join(BY)}, not {self.by!r}")
        if not 0 < self.target <= 1:
            raise UserError(f"--target must be a fraction in (0, 1] (0.99 = 99% of requests meet the SLO), "
                            f"not {self.target:g}")
        if self.max_probes < 2:
            raise UserError(f"--max-probes must be at least 2 (a bracket needs a probe on each side), "
                            f"not {self.max_probes}")
        if self.by == "concurrency" and self.start is not None and (self.start < 1 or self.start != int(self.start)):
            raise UserError(f"--start must be a whole concurrency of at least 1, not {self.start:g}")
        if self.by == "rate" and self.start is not None and not 0 < self.start < float("inf"):
            raise UserError(f"--start must be a positive, finite rate in requests/s, not {self.start:g}")
        if not 0 < self.tolerance < 1:
            raise UserError(f"--tolerance must be a fraction in (0, 1), not {self.tolerance:g}")

    def first_load(self) -> float:
        start = self.start if self.start is not None else DEFAULT_START[self.by]
        return int(start) if self.by == "concurrency" else float(start)


@dataclass
class Probe:
    """One probe's verdict: its load, attainment (with interval) and goodput."""

    load: float
    met: int
    n: int
    attainment: float | None
    low: float | None
    high: float | None
    goodput_per_gpu: float | None
    goodput_rps: float | None
    valid: bool
    meets: bool
    invalid_reason: str | None = None

    def text(self, target: float) -> str:
        att = "no measured request" if self.attainment is None else (
            f"attainment {100 * self.attainment:.1f}% ({self.met}/{self.n}, 95% CI "
            f"{100 * self.low:.1f}-{100 * self.high:.1f}%)")
        verdict = "meets" if self.meets else "misses"
        why = "" if self.valid else f"; invalid: {self.invalid_reason}"
        return f"{att} {verdict} the {100 * target:g}% target{why}"


class Search:
    """Bracket by doubling, then bisect; pure (no server), so it can be tested on a known boundary.

    ``lo`` is the highest load that met the target, ``hi`` the lowest that missed. A concurrency is a
    whole number; a rate is kept to 4 significant digits (it is stored and printed)."""

    def __init__(self, settings: SearchSettings) -> None:
        self.settings = settings
        self.probes: list[Probe] = []
        self.lo: Probe | None = None
        self.hi: Probe | None = None

    @property
    def bracketed(self) -> bool:
        return self.lo is not None and self.hi is not None

    def record(self, probe: Probe) -> None:
        self.probes.append(probe)
        if probe.meets:
            if self.lo is None or probe.load > self.lo.load:
                self.lo = probe
        elif self.hi is None or probe.load < self.hi.load:
            self.hi = probe

    def next_load(self) -> float | None:
        """The next probe's load, or None: done (bracket narrow enough, probes spent, no room left)."""
        if len(self.probes) >= self.settings.max_probes:
            return None
        if not self.probes:
            return self.settings.first_load()
        whole = self.settings.by == "concurrency"
        if self.hi is None:  # still climbing
            return self.lo.load * 2
        if self.lo is None:  # the first probes all missed: halve (a concurrency down to 1)
            load = self.hi.load // 2 if whole else float(f"{self.hi.load / 2:.4g}")
            return load if load >= 1 or not whole else None
        lo, hi = self.lo.load, self.hi.load
        if (whole and hi - lo <= 1) or hi <= lo * (1 + self.settings.tolerance):
            return None
        return (lo + hi) // 2 if whole else float(f"{(lo + hi) / 2:.4g}")

    def is_near(self) -> bool:
        """Is the next probe a bisection one (the boundary bracketed), and so a longer one?"""
        return self.bracketed


@dataclass
class CapacityResult:
    """What the search found, as stored in the run's ``extra.capacity``."""

    by: str
    slo: str
    target: float
    tolerance: float
    max_probes: int
    capacity: float | None  # the highest load that met the target (None: not even the lowest did)
    status: str  # bracketed | lower-bound (no probe missed) | below-lowest (every probe missed) | stopped
    goodput_per_gpu: float | None  # of the probe at capacity, tok/s/GPU
    goodput_rps: float | None
    below: dict | None  # the probe at capacity
    above: dict | None  # the lowest probe that missed
    probes: list[dict] = field(default_factory=list)
    note: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        unit = UNIT[self.by]
        if self.capacity is None:
            low = self.probes[-1]["load"] if self.probes else None
            return (f"no capacity: even {low:g} {unit} missed the target" if low is not None
                    else "no capacity: no probe finished")
        bound = {"bracketed": "", "lower-bound": " (a lower bound: no probe missed the target)",
                 "stopped": " (the search was stopped before it finished)"}.get(self.status, "")
        good = f", goodput {self.goodput_per_gpu:.1f} tok/s/GPU" if self.goodput_per_gpu is not None else ""
        return f"capacity {self.capacity:g} {unit} at SLO {self.slo}, {100 * self.target:g}% target{bound}{good}"


def result_of(search: Search, settings: SearchSettings, stopped: bool) -> CapacityResult:
    lo, hi = search.lo, search.hi
    if lo is None:
        status = "below-lowest" if search.probes else "stopped"
    elif stopped:
        status = "stopped"
    else:
        status = "bracketed" if hi is not None else "lower-bound"
    return CapacityResult(
        by=settings.by, slo=settings.slo.text, target=settings.target, tolerance=settings.tolerance,
        max_probes=settings.max_probes, capacity=lo.load if lo else None, status=status,
        goodput_per_gpu=lo.goodput_per_gpu if lo else None, goodput_rps=lo.goodput_rps if lo else None,
        below=asdict(lo) if lo else None, above=asdict(hi) if hi else None,
        probes=[asdict(p) for p in search.probes])


def probe_of(point: dict, settings: SearchSettings) -> Probe:
    """A stored level judged against the SLO, from the figures the sweep stored with it (the run's SLO is
    the search's). An invalid level misses the target whatever its attainment: a server that fails
    requests or runs past --level-timeout at this load is beyond its capacity."""
    frac = point.get("slo_attainment")
    meets = bool(point["valid"]) and frac is not None and frac >= settings.target
    load = point["rate"] if settings.by == "rate" else point["concurrency"]
    return Probe(load=load, met=point.get("slo_met") or 0, n=point.get("num_prompts") or 0, attainment=frac,
                 low=point.get("slo_attainment_low"), high=point.get("slo_attainment_high"),
                 goodput_per_gpu=point.get("goodput_per_gpu"), goodput_rps=point.get("goodput_rps"),
                 valid=bool(point["valid"]), meets=meets, invalid_reason=point.get("invalid_reason"))


def probe_level(cfg: SweepConfig, by: str, load: float, near: bool) -> Level:
    """The level of a probe. --num-prompts / --warmup as given (a count, or Kx: K x the concurrency, or
    K seconds' worth at the rate); else BRACKET_WAVES x the concurrency (BRACKET_SECONDS' worth at a
    rate), at least MIN_PROBE_REQUESTS, after one wave (one second's worth) of warmup. Near the
    boundary, NEAR_FACTOR x as many measured requests. A rate probe with --duration and no
    --num-prompts sends for that long, near the boundary too."""
    given = cfg.num_prompts is not None or cfg.num_prompts_x is not None
    warm_given = cfg.warmup is not None or cfg.warmup_x is not None
    if by == "rate":
        if not given and cfg.duration_s is not None:
            n = None
        else:
            n = cfg.rate_count(load) if given else max(MIN_PROBE_REQUESTS, round(BRACKET_SECONDS * load))
        warm = cfg.rate_count(load, warmup=True) if warm_given else round(load)
        return Level(None, rate=load, num_prompts=n * NEAR_FACTOR if near and n else n, warmup=warm or 0)
    conc = int(load)
    n = cfg.prompts_for(conc) if given else max(MIN_PROBE_REQUESTS, BRACKET_WAVES * conc)
    warm = cfg.warmup_for(conc) if warm_given else conc
    return Level(conc, num_prompts=n * NEAR_FACTOR if near else n, warmup=warm)


def prepare(cfg: SweepConfig, settings: SearchSettings) -> None:
    """One level of one trial planned: what the sweep's up-front estimate and progress display see (the
    search plans the rest as it goes)."""
    rate = settings.by == "rate"
    cfg.levels, cfg.rates = ([], [settings.first_load()]) if rate else ([int(settings.first_load())], [])
    cfg.trials = 1
    cfg.slo = settings.slo.text  # each probe stores its attainment and goodput like any level with an SLO


def run_capacity(cfg: SweepConfig, settings: SearchSettings, events: LevelEvents | None = None
                 ) -> tuple[SweepResult, CapacityResult]:
    """Launch or attach as the sweep does, probe level by level, store the result with the run."""
    settings.validate()
    prepare(cfg, settings)
    events = events or LevelEvents()
    say = events.message or (lambda text: None)
    search = Search(settings)
    finished = [False]

    def on_point(point: dict) -> None:
        if events.level_done:
            events.level_done(point)
        probe = probe_of(point, settings)
        search.record(probe)
        bracket = (f"capacity in [{search.lo.load:g}, {search.hi.load:g})" if search.bracketed else
                   f"capacity >= {search.lo.load:g}" if search.lo else f"capacity < {search.hi.load:g}")
        where = f"rate {probe.load:g}/s" if settings.by == "rate" else f"concurrency {probe.load:g}"
        say(f"probe {len(search.probes)}/{settings.max_probes}: {where}: "
            f"{probe.text(settings.target)}; {bracket}")

    def plan() -> Iterator[Level]:
        while (load := search.next_load()) is not None:
            before = len(search.probes)
            yield probe_level(cfg, settings.by, load, search.is_near())
            if len(search.probes) == before:  # stopped during warmup: nothing to judge, stop here
                return
        finished[0] = True

    def run_extra() -> dict:
        return {"capacity": result_of(search, settings, stopped=not finished[0]).as_dict()}

    hooks = LevelEvents(level_start=events.level_start, level_done=on_point, message=events.message,
                        run_extra=run_extra)
    say(f"capacity search by {settings.by} at SLO {settings.slo.text}, target {100 * settings.target:g}%: "
        f"doubling from {settings.first_load()}, then bisecting to {100 * settings.tolerance:g}%, "
        f"at most {settings.max_probes} probes")
    result = run_sweep(cfg, hooks, plan=plan())
    return result, result_of(search, settings, stopped=not finished[0])


def capacity_of(extra: dict | None) -> dict | None:
    """The stored search result of a run (its extra.capacity), or None."""
    cap = (extra or {}).get("capacity")
    return cap if isinstance(cap, dict) and "capacity" in cap else None


