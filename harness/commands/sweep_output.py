"""What `k2bench sweep` shows while it runs and when it ends: progress bars with each level's and the
sweep's remaining time, the per-level table, why a level is invalid or the sweep stopped, what was
kept after Ctrl-C, and how to look at the result in the dashboard."""

from __future__ import annotations

import shlex

from k2bench.harness import redact
from k2bench.harness.commands.common import table_console
from k2bench.harness.plan import estimate
from k2bench.harness.record import provenance
from k2bench.harness.record.schema import level_label
from k2bench.harness.run.sweep import EXIT_INTERRUPTED, EXIT_SERVER, SweepConfig, SweepResult


class SweepDisplay:
    """Progress bars on stderr; owns the rich Progress while the sweep runs (use as a context manager)."""

    def __init__(self, cfg: SweepConfig) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.cfg = cfg
        self.secrets = redact.sweep_secrets(cfg)
        self.console = Console(stderr=True)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                                 console=self.console, refresh_per_second=4)
        self.planned = cfg.planned_levels()
        self.sweep_task = None  # added with the first level: an error before it shows no empty bar
        self.finished = 0
        self.done_points: list[dict] = []  # finished levels, for the ETA

    def __enter__(self) -> SweepDisplay:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def say(self, text: str) -> None:
        self.console.print(self.secrets.scrub(text), style="dim", highlight=False, markup=False)

    def level_start(self, conc: int | str, trial: int, total: int):
        if self.sweep_task is None and len(self.planned) > 1:
            self.sweep_task = self.progress.add_task("sweep: levels", total=len(self.planned))
        label = (f"conc {conc}" if isinstance(conc, int) else str(conc)) + (f" trial {trial}" if self.cfg.trials > 1 else "")
        task = self.progress.add_task(label, total=total)
        failures = [0]

        def done(rec) -> None:
            if not rec.success:
                failures[0] += 1
                self.progress.update(task, description=f"{label} [red]{failures[0]} failed[/red]")
            self.progress.advance(task)

        return done

    def level_done(self, point: dict) -> None:
        self.finished += 1
        if self.sweep_task is not None:
            self.progress.advance(self.sweep_task)
        left = self.planned[self.finished:]
        self.done_points.append(point)
        speed = estimate.speed_from_points(self.done_points)
        if left and speed is not None:
            seconds = estimate.sweep_seconds(left, self.cfg.workload.osl, speed)
            text = f"about {estimate.duration_text(seconds)} left"
            if self.sweep_task is not None:
                self.progress.update(self.sweep_task, description=f"sweep: levels ({text})")
            self.say(f"level {self.finished} of {len(self.planned)} done; {len(left)} to go, {text} "
                     f"(from the finished levels' TTFT and TPOT)")


def devices(meta: dict) -> str:
    return provenance.device_label(meta.get("hardware"), meta.get("num_gpus") or 1)


def report(result: SweepResult, cfg: SweepConfig, db: str | None) -> None:
    """The end of a sweep: the table, then what the user needs to know, worst first."""
    from rich.text import Text

    from k2bench.harness.commands.dashboard import DEFAULT_HOST, DEFAULT_PORT
    from k2bench.harness.commands.runs import points_table

    err = table_console(stderr=True)
    secrets = redact.sweep_secrets(cfg)
    if result.points:
        m = result.meta
        title = Text(f"run {result.run_id} ({result.status}): {m.get('engine')} {m.get('model')}, "
                     f"{m.get('workload')}, {devices(m)}")  # Text: stored names are never parsed as markup
        table_console().print(points_table(result.points, title))
    for p in result.points:
        if not p["valid"]:
            where = (f"conc {p['concurrency']}" if p.get("mode", "closed") == "closed"
                     else level_label(p.get("mode"), p.get("rate"), p["concurrency"]))
            err.print(f"level {where} is invalid (kept, left out of frontiers and the gate): "
                      f"{secrets.scrub(str(p['invalid_reason']))}", style="yellow", highlight=False, markup=False)
    bad = sum(p["failed"] for p in result.points)
    if bad:
        first = next((e for p in result.points for e in p.get("errors") or []), "")
        err.print(f"{bad} request(s) failed; first error: {secrets.scrub(first)}", style="yellow", highlight=False, markup=False)
    if result.exit_code == EXIT_SERVER:
        err.print(f"k2bench: error: {secrets.scrub(str(result.problem))}", highlight=False, markup=False)
    if result.exit_code in (EXIT_SERVER, EXIT_INTERRUPTED):
        if result.run_id is None:
            err.print("no level finished; nothing was stored", highlight=False, markup=False)
        else:
            valid = sum(1 for p in result.points if p["valid"])
            invalid = len(result.points) - valid
            more = f" ({invalid} more stored invalid)" if invalid else ""
            err.print(f"run {result.run_id} kept as {result.status}: {valid} of {result.planned} levels{more}",
                      highlight=False, markup=False)
    if result.run_id is None:
        return
    if cfg.json_path:
        err.print(f"wrote {cfg.json_path}", highlight=False, markup=False)
    db_arg = f" --db {shlex.quote(secrets.scrub(db))}" if db else ""
    err.print(f"see it in the dashboard: k2bench dashboard{db_arg}   (then open http://{DEFAULT_HOST}:{DEFAULT_PORT})",
              highlight=False, markup=False)
