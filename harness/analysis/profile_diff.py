"""Which kernels and ops changed between two profiles: the per-step self time of each, from two
kernel-time summaries (``k2bench.profile/1``, what the bundled engine's /stop_profile answers).

Self time (a range's own time, without the ops it calls) per engine step: summing it over a step
counts every microsecond once, so the row that grew is the function or kernel that got slower, not
the ranges around it. Per step, so two profiles of a different number of requests compare. An op
present on one side only counts as zero on the other. Rows are ordered by the size of the change,
largest first.
"""

from __future__ import annotations

from dataclasses import dataclass

from k2bench.errors import UserError
from k2bench.harness.analysis.mdsafe import md_code, md_text

TOP = 15


@dataclass(frozen=True)
class OpChange:
    name: str
    kind: str  # cpu | cuda
    a_us: float  # self µs per step in A (0: absent)
    b_us: float
    a_calls: float  # calls per step
    b_calls: float

    @property
    def delta_us(self) -> float:
        return self.b_us - self.a_us

    @property
    def ratio(self) -> float | None:
        return self.b_us / self.a_us if self.a_us > 0 else None


def _per_step(summary: dict, where: str) -> dict[tuple[str, str], tuple[float, float]]:
    steps = summary.get("steps")
    if not isinstance(steps, int) or steps < 1:
        raise UserError(f"{where}: the profile covers no engine step, so it has no time per step")
    out = {}
    for op in summary.get("ops") or []:
        out[(str(op["name"]), str(op.get("kind", "cpu")))] = (float(op["self_us"]) / steps, float(op["calls"]) / steps)
    return out


def diff(a: dict, b: dict, top: int | None = TOP, where: tuple[str, str] = ("A", "B")) -> list[OpChange]:
    """The ops whose self time per step changed most (absolute change), largest first."""
    pa, pb = _per_step(a, where[0]), _per_step(b, where[1])
    rows = [OpChange(name, kind, pa.get((name, kind), (0.0, 0.0))[0], pb.get((name, kind), (0.0, 0.0))[0],
                     pa.get((name, kind), (0.0, 0.0))[1], pb.get((name, kind), (0.0, 0.0))[1])
            for name, kind in sorted(set(pa) | set(pb))]
    rows.sort(key=lambda r: (-abs(r.delta_us), r.name))
    return rows[:top] if top else rows


def _ratio(r: OpChange) -> str:
    if r.ratio is not None:
        return f"{r.ratio:.2f}x"
    return "new" if r.b_us > 0 else "-"


def markdown(rows: list[OpChange], a_label: str, b_label: str) -> str:
    """A markdown table (names come from a server: inert in the table)."""
    lines = [f"| op / kernel | kind | {md_text(a_label)} µs/step | {md_text(b_label)} µs/step | change µs/step | ratio |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {md_code(r.name[:120], in_table=True)} | {r.kind} | {r.a_us:,.1f} | {r.b_us:,.1f} | "
                     f"{r.delta_us:+,.1f} | {_ratio(r)} |")
    return "\n".join(lines)


def text_rows(rows: list[OpChange]) -> list[tuple[str, ...]]:
    """The table's cells as text, for a terminal table."""
    return [(r.name, r.kind, f"{r.a_us:,.1f}", f"{r.b_us:,.1f}", f"{r.delta_us:+,.1f}", _ratio(r),
             f"{r.a_calls:.2f}", f"{r.b_calls:.2f}") for r in rows]


def compare_runs(a_run: dict, b_run: dict, top: int | None = TOP) -> list[OpChange]:
    """The diff of two stored runs' profiles; UserError naming the run that has none to compare."""
    for run in (a_run, b_run):
        prof = run.get("profile") or {}
        if not isinstance(prof.get("summary"), dict):
            why = prof.get("error") or ("its server gave no kernel-time summary" if prof else
                                        "it was not profiled (sweep with --profile-level C[:N])")
            raise UserError(f"run {run.get('id')} has no kernel-time summary: {why}")
    return diff(a_run["profile"]["summary"], b_run["profile"]["summary"], top,
                (f"run {a_run.get('id')}", f"run {b_run.get('id')}"))


def report_section(a_run: dict, b_run: dict, a_label: str, b_label: str, top: int = 10) -> str | None:
    """Markdown for a verdict's report: both sides' traces and the kernel-time diff; None when either
    side has no profile at all, a note when one cannot be compared."""
    if not a_run.get("profile") or not b_run.get("profile"):
        return None
    lines = ["### Profiles", ""]
    for label, run in ((a_label, a_run), (b_label, b_run)):
        prof = run["profile"]
        trace = prof.get("trace")
        lines.append(f"- {md_text(label)} (run {run.get('id')}): "
                     + (f"trace {md_code(trace)}" if trace else f"no trace ({md_text(prof.get('error') or 'none kept')})"))
    lines.append("")
    try:
        rows = compare_runs(a_run, b_run, top)
    except UserError as exc:
        return "\n".join([*lines, f"No kernel-time diff: {md_text(exc)}", ""])
    lines += [f"Kernel and op self time per engine step, largest change first "
              f"(`k2bench profile-diff {a_run.get('id')} {b_run.get('id')}`):", "",
              markdown(rows, a_label, b_label), ""]
    return "\n".join(lines)


def latest_profiled(store, run_ids: list[int]) -> dict | None:
    """The newest of ``run_ids`` that kept a profile (None: none did)."""
    runs = [store.get_run(r) for r in sorted(run_ids, reverse=True)]
    return next((r for r in runs if r.get("profile")), None)


def verdict_profiles(store, good_ids: list[int], bad_ids: list[int], good_label: str, bad_label: str,
                     top: int = 10) -> tuple[str | None, dict | None]:
    """For a verdict that blamed ``bad_ids`` against ``good_ids``: the markdown section and its JSON
    (both sides' run and trace, the top rows), or (None, None) when a side kept no profile."""
    good, bad = latest_profiled(store, good_ids), latest_profiled(store, bad_ids)
    if good is None or bad is None:
        return None, None
    doc: dict = {label: {"run": run["id"], "trace": run["profile"].get("trace")}
                 for label, run in ((good_label, good), (bad_label, bad))}
    try:
        doc["diff"] = [{"name": r.name, "kind": r.kind, f"{good_label}_us_per_step": r.a_us,
                        f"{bad_label}_us_per_step": r.b_us, "change_us_per_step": r.delta_us}
                       for r in compare_runs(good, bad, top)]
    except UserError as exc:
        doc["diff"], doc["why_no_diff"] = [], str(exc)
    return report_section(good, bad, good_label, bad_label, top), doc
