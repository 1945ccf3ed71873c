"""The running of one planned level on the sweep's server: its requests (a closed loop's prompts or
sessions, a rate's seeded schedule, a trace at its own times), sent with the server watched, and the
level's point: its figures, the server's counters and GPU power over its window, SLO attainment, the
client's own measurement and the verdict on its validity.

The sweep (`run/sweep.py`) owns the run: it plans the levels, hands them here one at a time and stores
each point that comes back. The capacity search (`run/capacity.py`) chooses its levels as it goes and
has the sweep run them, so every level of either command runs through `LevelRunner.run`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from k2bench.errors import ServerError, UserError
from k2bench.harness.load import openloop, procs, procs_rate, schedule, selfmeasure
from k2bench.harness.load.client_size import ClientSizer
from k2bench.harness.load.level_watch import LevelWatch
from k2bench.harness.load.loadgen import LevelSpec, level_failure
from k2bench.harness.load.loadgen import run as run_async
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure import workload_metrics
from k2bench.harness.measure.slo import Slo, attainment
from k2bench.harness.measure.validity import judge_level
from k2bench.harness.run import level_work
from k2bench.harness.run.config import SweepConfig
from k2bench.harness.servers import launch
from k2bench.harness.telemetry.level import LevelTelemetry
from k2bench.workloads.build import level_prompts

# what the progress display is told when a level starts: (concurrency or rate name, trial, requests in all);
# it may hand back a hook called with each finished request
LevelStart = Callable[[int | str, int, int], Callable[[RequestRecord], None] | None]
# a level ready to send: (its name, requests in flight at most, measured requests planned, the coroutine that
# sends it and returns (records, the client's self-measurements))
Prepared = tuple[str, int, int, Coroutine[Any, Any, tuple[list[RequestRecord], list[dict]]]]


@dataclass(frozen=True)
class Level:
    """One level to measure: a concurrency (closed loop) or a rate (open loop, requests/s). Counts left
    None come from the config (prompts_for / warmup_for, rate_count)."""

    concurrency: int | None
    rate: float | None = None
    trial: int = 0
    num_prompts: int | None = None
    warmup: int | None = None


def planned(cfg: SweepConfig) -> list[Level]:
    """The config's levels x trials: each concurrency, then each rate; a trace is one level per trial."""
    if cfg.workload.source == "trace":  # one open-loop level per trial, sent at the trace's own times
        return [Level(None, rate=level_work.trace_rate(cfg.workload), trial=t) for t in range(cfg.trials)]
    return ([Level(c, trial=t) for c in cfg.levels for t in range(cfg.trials)]
            + [Level(None, rate=r, trial=t) for r in cfg.rates for t in range(cfg.trials)])


@dataclass
class LevelOutcome:
    """What a level left: its point with the records behind it, or no point when it was stopped during
    warmup; and the level watch's note when it stopped early."""

    name: str  # "concurrency 8", "rate 2/s": how messages name the level
    concurrency: int  # requests in flight at most (a rate level's cap)
    point: dict | None  # None: nothing measured (stopped before a measured request was sent)
    records: list[RequestRecord]
    stopped: str | None  # why the level stopped early (the level watch), or None
    server_down: bool  # the server died or stopped answering: no further level can run


async def _unmetered(level: Awaitable[list[RequestRecord]]) -> tuple[list[RequestRecord], list[dict]]:
    """(records, no client meters): a level run where the client does not measure itself (conversations)."""
    return await level, []


class LevelRunner:
    """Runs the levels of one sweep on one server, one at a time. It keeps what spans levels: the
    client sizer, which learns from each level how many client processes the next one needs."""

    def __init__(self, cfg: SweepConfig, srv: launch.ServerHandle, *, model: str, vocab, num_gpus: int,
                 tel: LevelTelemetry, sizer: ClientSizer, slo: Slo | None,
                 level_start: LevelStart | None = None) -> None:
        self.cfg, self.srv, self.model, self.vocab, self.num_gpus = cfg, srv, model, vocab, num_gpus
        self.tel, self.sizer, self.slo, self.level_start = tel, sizer, slo, level_start

    def run(self, lv: Level) -> LevelOutcome:
        """Send the level and judge it. Raises UserError when the server refuses the prompts' token ids
        and ServerError when its requests failed; a level the watch stopped (server gone, --level-timeout)
        comes back with its note, stored as invalid if anything was measured."""
        watch = LevelWatch(server_gone=self.srv.death_note, timeout_s=self.cfg.level_timeout_s)
        name, conc, planned_n, level = (self._closed(lv, watch) if lv.rate is None else self._rate(lv, watch))
        try:
            records, meters = run_async(level)
        finally:
            self.tel.abort()  # a level cut short leaves no window open (a no-op after end())
        watch.name_the_exit()
        if watch.prompts_rejected:
            raise UserError(f"{name}: {watch.stopped}\nthe prompts' token ids are not all in "
                            f"the server's vocabulary: pass --model <folder or id> so prompts use the "
                            f"server's vocabulary")
        failure = level_failure(records) if watch.stopped is None else None
        if failure:
            died = self.srv.death_note()
            raise ServerError(f"{name}: {failure}" + (f"\n{died}" if died else ""))
        point = None
        if any(not r.warmup for r in records):  # else stopped before a measured request was sent
            point = self._point(lv, conc, planned_n, records, meters, watch.stopped)
        return LevelOutcome(name, conc, point, records, watch.stopped, watch.server_down)

    def _on_done(self, label: int | str, trial: int, total: int) -> Callable[[RequestRecord], None] | None:
        return self.level_start(label, trial, total) if self.level_start else None

    def _closed(self, lv: Level, watch: LevelWatch) -> Prepared:
        """A closed-loop level: its prompts (or sessions) over the sweep's server."""
        cfg, w, conc, trial = self.cfg, self.cfg.workload, lv.concurrency, lv.trial
        # one distinct prompt per request, warmup included: a server with prefix caching
        # must not get measured requests it has already seen
        work = level_work.plan(w, cfg.prompts_for(conc) if lv.num_prompts is None else lv.num_prompts,
                               cfg.warmup_for(conc) if lv.warmup is None else lv.warmup, url=self.srv.url,
                               model=self.model, vocab=self.vocab, seed=w.seed * 1_000_003 + conc * 1009 + trial)
        spec = LevelSpec(base_url=self.srv.url, model=self.model, concurrency=conc, num_prompts=work.planned,
                         num_warmup=work.warmup, timeout_s=cfg.timeout_s, api_key=cfg.api_key)
        on_done = self._on_done(conc, trial, work.total)
        window = (self.tel.begin, self.tel.end)
        if work.sessions is not None:  # conversations: sessions are the loop's users, one process
            level = _unmetered(work.level(spec, on_done, watch, on_window=window))
        else:
            level = procs.closed_level(spec, work.prompts or [], self.sizer.procs_for(conc), on_done, watch,
                                       on_window=window)
        return f"concurrency {conc}", conc, work.planned, level

    def _rate(self, lv: Level, watch: LevelWatch) -> Prepared:
        """An open-loop level: a rate's seeded schedule, or a trace at its own times."""
        cfg, w, rate, trial = self.cfg, self.cfg.workload, lv.rate, lv.trial
        name = f"rate {rate:g}/s"
        if w.source == "trace":
            prompts, offsets, warm = level_work.trace_prompts(w, self.vocab), level_work.trace_offsets(w), 0
        else:
            level_seed = schedule.level_seed(w.seed, rate, trial)
            count = cfg.rate_count(rate) if lv.num_prompts is None else lv.num_prompts
            warm = (cfg.rate_count(rate, warmup=True) or 0) if lv.warmup is None else lv.warmup
            offsets, warm = schedule.level_schedule(rate, count, warm, cfg.burstiness, level_seed,
                                                    cfg.ramp_up_s, cfg.duration_s)
            prompts = level_prompts(w, len(offsets), base_url=self.srv.url, model=self.model,
                                    vocab=self.vocab, seed=level_seed + 1)
        n, conc = len(offsets) - warm, openloop.in_flight_cap(cfg.max_inflight, len(offsets))
        spec = LevelSpec(base_url=self.srv.url, model=self.model, concurrency=conc, num_prompts=n,
                         num_warmup=warm, timeout_s=cfg.timeout_s, api_key=cfg.api_key)
        on_done = self._on_done(name, trial, len(offsets))
        level = procs_rate.rate_level(spec, prompts, offsets, rate, warm, cfg.max_inflight,
                                      self.sizer.procs_for_rate(rate, w.osl, len(offsets)), on_done, watch,
                                      on_window=(self.tel.begin, self.tel.end))
        return name, conc, n, level

    def _point(self, lv: Level, conc: int, planned_n: int, records: list[RequestRecord], meters: list,
               stopped: str | None) -> dict:
        """The level's stored point: its figures, then what telemetry, the SLO and the client's own
        measurement add, then the verdict on its validity (which reads them all)."""
        from k2bench.harness.measure.metrics import summarize_level

        point = summarize_level(records, concurrency=conc, num_gpus=self.num_gpus, trial=lv.trial)
        if lv.rate is not None:
            point.update(openloop.level_figures(records, lv.rate))
        point.update(self.tel.fields(point))
        workload_metrics.prefer_server(point)
        if self.slo is not None:
            point.update(attainment(records, self.slo, duration_s=point["duration_s"],
                                    num_gpus=self.num_gpus).fields())
        client = selfmeasure.combine(meters) if meters else None
        self.sizer.measured(conc if lv.rate is None else None, records, client)
        point.update(selfmeasure.point_fields(client))
        point["valid"], point["invalid_reason"] = judge_level(point, records, self.cfg.rules, planned=planned_n,
                                                              stopped=stopped)
        return point
