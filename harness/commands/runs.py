"""`k2bench runs`, `show RUN`, `export RUN --json PATH`, `import FILE...`: the stored runs.

Heavy imports (sqlalchemy, rich) happen inside the handlers so that `k2bench --help` stays fast.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from k2bench.harness.commands.common import add_db_arg, table_console

if TYPE_CHECKING:
    from rich.table import Table



def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list stored runs, newest first",
                       description="Stored runs, newest first. A run still marked running whose writer process "
                                   "on this host has died is shown as partial.")
    p.add_argument("--engine")
    p.add_argument("--model")
    p.add_argument("--hardware")
    p.add_argument("--branch")
    p.add_argument("--commit", help="commit or its prefix")
    p.add_argument("--workload")
    p.add_argument("--status", choices=["running", "complete", "partial", "failed"], help="stored status")
    p.add_argument("--limit", type=int, default=50, help="at most this many runs (default 50; 0 = all)")
    add_db_arg(p)
    p.set_defaults(handler=_runs)

    s = sub.add_parser("show", help="one run: metadata and its per-level table")
    s.add_argument("run", metavar="RUN", help="run id (see `k2bench runs`)")
    s.add_argument("--repro", action="store_true",
                   help="print a shell sequence that re-runs the measurement (commands, environment, versions)")
    add_db_arg(s)
    s.set_defaults(handler=_show)

    e = sub.add_parser("export", help="write a run as k2bench.run JSON")
    e.add_argument("run", metavar="RUN", help="run id")
    e.add_argument("--json", required=True, metavar="PATH", dest="json_path", help="file to write")
    e.add_argument("--requests", action="store_true", help="include every request's raw stamps")
    add_db_arg(e)
    e.set_defaults(handler=_export)

    i = sub.add_parser("import", help="store k2bench.run JSON files (or other tools' results) as new runs",
                       description="Every file is validated before anything is written, then all of them are "
                                   "stored in one transaction (all or none). Values must be strict JSON (no "
                                   "NaN/Infinity, 64-bit integers) and physical (see the store docs). With --from, other "
                                   "tools' result files are mapped to runs (one per configuration, a level per "
                                   "file); figures a tool does not report are stored as missing.")
    i.add_argument("files", nargs="+", metavar="FILE")
    i.add_argument("--allow-duplicate", action="store_true",
                   help="store a file whose run is already stored (default: refused, since a copy would shrink "
                        "the gate's noise estimate)")
    add_db_arg(i)
    other = i.add_argument_group("other tools' results (--from)")
    other.add_argument("--from", dest="source", choices=("vllm", "inferencex", "aiperf"),
                       help="vllm: `vllm bench serve --save-result` JSON; inferencex: per-configuration result "
                            "JSON; aiperf: profile_export_aiperf.json")
    other.add_argument("--gpus", type=int, default=None, help="GPUs that served the run (when the file lacks it)")
    other.add_argument("--engine", help="engine that was measured (default: from the file, else 'unknown')")
    other.add_argument("--hardware", help="hardware to record")
    other.add_argument("--commit", help="commit to record")
    other.add_argument("--branch", help="branch to record")
    other.add_argument("--tag", action="append", metavar="KEY=VALUE", help="tag to record (repeatable)")
    i.set_defaults(handler=_import)


def _date(iso: str | None) -> str:
    return "-" if not iso else iso[:16].replace("T", " ")


def points_table(points: list[dict], title: str | None = None) -> Table:
    """The per-level table (also what a sweep prints at its end): one row per level and trial.

    Every header and number format comes from the catalogue: its table metrics and level fields."""
    from rich.table import Table

    from k2bench.harness.measure.catalogue import (
        FIELDS,
        LEVEL_TABLE_FIELDS,
        RATE_TABLE_METRICS,
        TABLE_METRICS,
    )
    from k2bench.harness.record import schema

    trials = len({p.get("trial", 0) for p in points}) > 1
    mismatches = any(p.get("osl_mismatches") for p in points)
    rates = any(p.get("mode") == "rate" for p in points)  # rate levels: a level column and their figures
    metrics = (*TABLE_METRICS, *(RATE_TABLE_METRICS if rates else ()))
    table = Table(title=title, title_justify="left")
    if rates:
        table.add_column(FIELDS["level"].header, justify="right")
    table.add_column(FIELDS["concurrency"].header, justify="right")
    if trials:
        table.add_column(FIELDS["trial"].header, justify="right")
    for name in (*(m.header for m in metrics), *(f.header for f in LEVEL_TABLE_FIELDS),
                 FIELDS["failed"].header):
        table.add_column(name, justify="right")
    if mismatches:
        table.add_column(FIELDS["osl_mismatches"].header, justify="right")
    marked = any(p.get("valid") is False for p in points)
    if marked:
        table.add_column(FIELDS["valid"].header)
    for p in points:
        flat = schema.to_columns(schema.POINT, p)
        row = [schema.level_label(p.get("mode"), p.get("rate"), p["concurrency"])] if rates else []
        row.append(str(p["concurrency"]))
        if trials:
            row.append(str(p.get("trial", 0)))
        row += [m.format(flat.get(m.column)) for m in metrics]
        row += [f.format(flat.get(f.column)) for f in LEVEL_TABLE_FIELDS]
        row.append("-" if p.get("num_prompts") is None else f"{p['failed']}/{p['num_prompts']}")
        if mismatches:
            row.append(str(p.get("osl_mismatches") or 0))
        if marked:
            row.append("yes" if p.get("valid") is not False else "INVALID")
        table.add_row(*row, style="dim" if p.get("valid") is False else None)
    return table


def _open(args, readonly: bool):
    """runs, show and export only read: they never create or upgrade a database (see `k2bench db upgrade`)."""
    from k2bench.harness.store import Store

    return Store.open(args.db, readonly=readonly)


def _runs(args) -> int:
    from rich.table import Table
    from rich.text import Text

    filters = {k: getattr(args, k) for k in ("engine", "model", "hardware", "branch", "commit", "workload", "status")}
    filters = {k: v for k, v in filters.items() if v is not None}
    if args.limit and args.limit > 0:
        filters["limit"] = args.limit
    with _open(args, readonly=True) as store:
        runs = store.list_runs(**filters)
    console = table_console()
    if not runs:
        console.print("no runs stored yet (run `k2bench sweep` or `k2bench import FILE`)")
        return 0
    table = Table()
    for name in ("id", "date (UTC)", "commit", "engine", "model", "workload", "status", "levels"):
        table.add_column(name, justify="right" if name in ("id", "levels") else "left")
    for r in runs:  # stored names are plain Text: "[/red]" in a model name is shown, never parsed as markup
        table.add_row(str(r["id"]), _date(r["started_at"]), Text((r["commit"] or "-")[:10]), Text(r["engine"]),
                      Text(r["model"]), Text(r["workload"] or "-"), r["effective_status"],
                      str(r["levels"]) + (f" ({r['invalid_levels']} invalid)" if r.get("invalid_levels") else ""))
    console.print(table)
    return 0


def _status_text(run: dict) -> str:
    if run["effective_status"] != run["status"]:
        return f"{run['effective_status']} (recorded {run['status']}; the process writing it is gone)"
    return run["status"]


def _show(args) -> int:
    import json

    from k2bench.harness.record import schema

    with _open(args, readonly=True) as store:
        run = store.get_run(args.run)
        doc = store.export_run(run["id"])
    if args.repro:
        from k2bench.harness.record.repro import script

        print(script(run, len(doc["points"])), end="")
        return 0
    console = table_console()
    lines = [("run", str(run["id"])), ("status", _status_text(run))]
    for key in (s.name for s in schema.RUN if s.name not in ("id", "status")):
        value = run.get(key)
        if value is None or value == {} or value == []:
            continue
        lines.append((key, value if isinstance(value, str) else json.dumps(value, sort_keys=True)))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        console.print(f"{key:<{width}}  {value}", highlight=False, markup=False)
    if doc["points"]:
        console.print(points_table(doc["points"]))
        trials = len({p["trial"] for p in doc["points"]}) > 1
        for p in doc["points"]:
            where = f"conc {p['concurrency']}" + (f" trial {p['trial']}" if trials else "")
            if p.get("valid") is False:
                console.print(f"{where}: invalid (left out of frontiers, the gate and change points): "
                              f"{p.get('invalid_reason') or 'no reason stored'}", highlight=False, markup=False)
            if p["errors"]:
                console.print(f"{where}: first errors: " + "; ".join(p["errors"]), highlight=False, markup=False)
    else:
        console.print("no finished levels")
    for ev in doc["evals"]:
        console.print(eval_line(ev), highlight=False, markup=False)
    return 0


def eval_line(ev: dict) -> str:
    """One accuracy evaluation as `show` prints it."""
    stderr = f" ± {ev['stderr']:.4f}" if ev.get("stderr") is not None else ""
    under = f" at concurrency {ev['concurrency']}" if ev.get("concurrency") else ""
    return f"eval {ev['task']}: {ev['metric']} {ev['value']:.4f}{stderr} (n={ev['n']}{under})"


def _levels(doc: dict) -> str:
    n = len(doc["points"])
    return f"{n} level" if n == 1 else f"{n} levels"


def _export(args) -> int:
    from k2bench.harness.record.runjson import write_doc

    with _open(args, readonly=True) as store:
        run = store.get_run(args.run)
        doc = store.export_run(run["id"], include_requests=args.requests)
    write_doc(doc, args.json_path)
    extra = f", {len(doc['requests'])} requests" if args.requests else ""
    print(f"wrote run {run['id']} to {args.json_path} ({_levels(doc)}{extra})")
    return 0


def _import(args) -> int:
    from k2bench.errors import UserError
    from k2bench.harness.record.runjson import load_doc
    from k2bench.harness.store.importing import DuplicateRun

    if args.source:
        from k2bench.harness import importers
        from k2bench.harness.plan.settings_text import parse_tags

        opts = importers.ImportOptions(gpus=args.gpus, engine=args.engine, hardware=args.hardware,
                                       commit=args.commit, branch=args.branch, tags=parse_tags(args.tag))
        mapped = importers.to_documents(args.source, args.files, opts)
        docs = [(", ".join(doc["run"]["extra"]["imported_files"]), doc) for doc in mapped]
    else:
        docs = [(path, load_doc(path)) for path in args.files]  # validate everything before writing anything
    with _open(args, readonly=False) as store:
        try:  # one transaction for every file; the duplicate check runs inside it
            ids = store.import_runs([doc for _, doc in docs], allow_duplicate=args.allow_duplicate)
        except DuplicateRun as dup:
            raise UserError(f"{docs[dup.index][0]}: this run is already stored as run {dup.run_id} (same start, "
                            f"levels and numbers); a copy would count twice in the gate's noise estimate. Nothing "
                            f"was imported; pass --allow-duplicate to store it anyway") from None
    for (path, doc), run_id in zip(docs, ids, strict=True):
        print(f"imported {path} as run {run_id} ({_levels(doc)})")
    return 0
