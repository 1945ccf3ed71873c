"""The command line itself: hints for mistyped commands and flags, the arguments every command shares,
and `serve --help` showing the engine's real defaults and choices without importing torch."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from k2bench.harness import cli
from k2bench.harness.commands import common


def _error_of(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2  # bad input
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_unknown_flag_suggests_the_real_one(capsys) -> None:
    line = _error_of(["sweep", "--concurrency", "4"], capsys)
    assert line == "k2bench sweep: error: unrecognized arguments: --concurrency 4; did you mean --conc?"
    line = _error_of(["sweep", "--num-promts=3"], capsys)
    assert line.endswith("did you mean --num-prompts?")
    line = _error_of(["runs", "--limt", "3", "--enigne", "x"], capsys)
    assert line.startswith("k2bench runs: error: unrecognized arguments: --limt 3 --enigne x")
    assert "--limt: did you mean --limit?" in line and "--enigne: did you mean --engine?" in line


def test_unknown_flag_far_from_any_gets_no_guess(capsys) -> None:
    line = _error_of(["runs", "--zzzzzz"], capsys)
    assert line == "k2bench runs: error: unrecognized arguments: --zzzzzz"


def test_unknown_command_and_choice_suggest_the_closest(capsys) -> None:
    assert _error_of(["swep"], capsys).endswith("did you mean 'sweep'?")
    assert _error_of(["engine", "tyni", "--out", "x"], capsys).endswith("did you mean 'tiny'?")
    line = _error_of(["regress", "--candidate", "1", "--format", "mdd"], capsys)
    assert line.startswith("k2bench regress: error: argument --format: invalid choice")
    assert line.endswith("did you mean 'md'?")
    assert "did you mean" not in _error_of(["qqqqqq"], capsys)


@pytest.mark.parametrize(("word", "options", "guess"), [
    ("--concurrency", ["--conc", "--url", "--osl"], "--conc"),  # the flag typed in full
    ("--isll", ["--isl", "--osl"], "--isl"),
    ("tyni", ["tiny"], "tiny"),  # transposed letters
    ("--x", ["--conc", "--url"], None),
])
def test_closest(word: str, options: list[str], guess: str | None) -> None:
    assert cli.closest(word, options) == guess


def test_every_store_command_shares_one_db_argument() -> None:
    from k2bench.harness.store.db import DEFAULT_DB_URL

    assert common.DEFAULT_DB_URL == DEFAULT_DB_URL  # the help states the store's real default
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    with_db = {name for name, p in sub.choices.items() if any("--db" in a.option_strings for a in p._actions)}
    assert with_db == {"sweep", "capacity", "runs", "show", "export", "import", "regress", "changepoints",
                       "dashboard", "backfill", "bisect", "profile-diff"}
    for name in with_db:
        action = next(a for a in sub.choices[name]._actions if "--db" in a.option_strings)
        assert action.help == common.DB_HELP and action.default is None


def test_a_missing_command_module_is_an_error_not_a_silently_missing_command(monkeypatch) -> None:
    monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, "no_such_command"))
    with pytest.raises(ModuleNotFoundError, match="no_such_command"):
        cli.build_parser()


def test_tables_printed_to_a_pipe_are_wide() -> None:
    assert common.table_console().width == common.PIPE_WIDTH  # pytest captures stdout: not a terminal


SERVE_HELP_WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # any `import torch` now fails
from k2bench.harness import cli
cli.build_parser()
assert "torch" not in [m.split(".")[0] for m in sys.modules if sys.modules[m] is not None]
cli.main(["serve", "--help"])
"""


def test_serve_help_shows_every_default_and_choice_without_torch() -> None:
    out = subprocess.run([sys.executable, "-c", SERVE_HELP_WITHOUT_TORCH], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # argparse wraps lines
    from k2bench.engine.runtime.runtime_config import RuntimeConfig

    rt = RuntimeConfig()
    assert "runtime_config" not in text
    assert re.search(r"--backend \{auto,torch,triton[,}]", text)
    assert "port to listen on (default 8000)" in text
    for flag, default in (("--max-num-seqs", rt.max_num_seqs), ("--max-num-batched-tokens", rt.max_num_batched_tokens),
                          ("--block-size", rt.block_size), ("--kv-cache-dtype", rt.kv_cache_dtype)):
        assert re.search(re.escape(flag) + r" [^-]*?\(default " + re.escape(str(default)), text), flag
    # every option with a value says what happens when it is left out
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for action in sub.choices["serve"]._actions:
        if action.option_strings and action.option_strings[0] not in ("-h", "--model"):
            assert action.help and "default" in action.help, action.option_strings


def test_sweep_help_lists_the_exit_codes(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["sweep", "--help"])
    out = capsys.readouterr().out
    table = out[out.index("exit codes:"):]
    for code, meaning in ((0, "every level valid"), (1, "some level invalid"), (2, "bad input"),
                          (3, "server problem"), (130, "interrupted")):
        assert re.search(rf"^  {code} +{meaning}", table, re.MULTILINE), code
