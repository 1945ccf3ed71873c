"""Rich markup in stored names is shown as text: `k2bench runs` and a sweep's summary survive it."""

from __future__ import annotations

from store_helpers import run_meta, write_levels

from k2bench.harness.cli import main

MARKUP = "[/red]tiny[bold]"


def test_runs_lists_names_with_rich_markup(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'k.db'}"
    write_levels(db, [2], meta=run_meta(model=MARKUP, engine="[/]", workload="[link=x]w"))
    capsys.readouterr()
    assert main(["runs", "--db", db]) == 0
    out = capsys.readouterr().out
    assert MARKUP in out and "[/]" in out and "[link=x]w" in out


def test_sweep_summary_survives_rich_markup_in_the_model_name(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'k.db'}"
    code = main(["sweep", "--engine", "testserver", "--model", MARKUP, "--server-args", "--ttft-ms 5 --itl-ms 1",
                 "--isl", "16", "--osl", "4", "--conc", "1", "--num-prompts", "2", "--warmup", "0", "--db", db])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert MARKUP in captured.out  # the table's title names the model as stored
