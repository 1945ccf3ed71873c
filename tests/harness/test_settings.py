"""The one declaration of a sweep's settings: every declared setting is a flag of each command that takes
it and a key of suite files, lands in the SweepConfig the same way from either, and is checked the same
way; unknown keys and bad values in suite files are refused with the file, the key and the reason."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from k2bench.errors import UserError
from k2bench.harness.cli import build_parser, main
from k2bench.harness.plan import settings, suites
from k2bench.harness.plan.settings import SETTINGS
from k2bench.harness.run.jobrun import job_config
from k2bench.harness.run.sweep import SweepConfig
from k2bench.workloads import loader

SUBCOMMANDS = {settings.SWEEP: ["sweep"], settings.BACKFILL: ["backfill"], settings.BISECT: ["bisect"],
               settings.SUITE_RUN: ["suite", "run"]}
NEEDED = {settings.SWEEP: [], settings.BACKFILL: ["HEAD", "--repo", ".", "--server-cmd", "x {port}"],
          settings.BISECT: ["--repo", ".", "--server-cmd", "x {port}"], settings.SUITE_RUN: ["s.toml"]}


def _parser_of(command: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = build_parser()
    for word in SUBCOMMANDS[command]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


def _argv(s: settings.Setting) -> list[str]:
    if s.kind is bool:
        return [s.flag]
    rate = ["--rate", "2"] if s.name in settings.RATE_ONLY else []  # these shape rate levels only
    return [*rate, s.flag, str(s.example)]


def test_the_declaration_is_complete() -> None:
    assert len(SETTINGS) > 25 and len({s.name for s in SETTINGS}) == len(SETTINGS)
    for s in SETTINGS:
        assert s.help and s.group in settings.GROUPS and s.commands <= set(settings.COMMANDS), s.name
        assert not s.key or s.example is not None, f"{s.name}: a suite key needs an example value"


@pytest.mark.parametrize("command", settings.COMMANDS)
def test_every_declared_setting_is_a_flag_of_each_command_that_takes_it(command: str) -> None:
    actions = {a.dest: a for a in _parser_of(command)._actions}
    for s in SETTINGS:
        declared = s.name in actions and s.flag in actions[s.name].option_strings
        assert declared == (command in s.commands), f"{s.flag} on {command}"
    help_text = _parser_of(command).format_help()
    assert all(s.flag in help_text for s in SETTINGS if command in s.commands)


WORKLOAD_ATTR = {"workload": "name", "trace": "path"}  # where a workload setting lands in the Workload


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.example is not None or s.kind is bool], ids=lambda s: s.name)
def test_a_flag_lands_in_the_config(s: settings.Setting) -> None:
    """From the command line to the SweepConfig, for every command that takes the setting."""
    for command in s.commands:
        args = build_parser().parse_args([*SUBCOMMANDS[command], *NEEDED[command], *_argv(s)])
        given = settings.from_args(args, command)
        cfg = SweepConfig.from_settings(given)
        expected = True if s.kind is bool else s.parse(s.example, s.flag)
        if s.name in settings.WORKLOAD_KEYS:
            assert getattr(cfg.workload, WORKLOAD_ATTR.get(s.name, s.name)) == expected
        else:
            assert settings._read(cfg, s) == expected, (command, s.name)
            assert settings._read(SweepConfig.from_settings({}), s) != expected  # the flag, not the default, put it there


@pytest.mark.parametrize("s", list(settings.FILE_KEYS.values()), ids=lambda s: s.name)
def test_every_suite_key_is_accepted_and_lands_in_the_job_config(tmp_path: Path, s: settings.Setting) -> None:
    value = repr(s.example) if not isinstance(s.example, bool) else str(s.example).lower()
    path = tmp_path / "s.toml"
    rate = "rate = 2\n" if s.name in settings.RATE_ONLY else ""  # these shape rate levels only
    path.write_text(f"[[matrix]]\n{rate}{s.name} = {value}\n")
    suite = suites.load(path)
    (job,) = suite.jobs
    cfg = job_config(suite, job)
    expected = s.parse(s.example, s.name)
    if s.name in settings.WORKLOAD_KEYS:
        assert getattr(cfg.workload, WORKLOAD_ATTR.get(s.name, s.name)) == expected
    else:
        assert settings._read(cfg, s) == expected


def test_keys_that_are_no_setting_are_refused(tmp_path: Path) -> None:
    for key in ("engin", "url", "api_key", "concurrency"):  # a typo; settings a suite file may not carry
        path = tmp_path / f"{key}.toml"
        path.write_text(f"[[matrix]]\n{key} = 'x'\n")
        with pytest.raises(UserError, match=f"unknown field '{key}'"):
            suites.load(path)


@pytest.mark.parametrize(("line", "reason"), [
    ("isl = 0", "isl = 0 must be at least 1"),
    ("osl = [8, 0]", "osl = 0 must be at least 1"),
    ("tp = 0", "tp = 0 must be at least 1"),
    ("conc = '3..100'", "conc '3..100': a range runs over powers of two"),
    ("warmup = 'twice'", "warmup takes a count (40) or a multiple of the concurrency (2x), not 'twice'"),
    ("num_prompts = '0x'", "num_prompts = '0x' as a multiple of the concurrency must be positive"),
    ("timeout = -1", "timeout = -1 must be positive"),
    ("max_failure_rate = 1.5", "must be at least 0 and below 1"),
    ("gpu_ids = '0,,1'", "expected a comma-separated list"),
    (f"model = '{'m' * 201}'", "is 201 characters; a stored name keeps at most 200"),
])
def test_a_bad_value_in_a_suite_file_names_the_file_the_key_and_the_reason(tmp_path: Path, line: str,
                                                                           reason: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f"[[matrix]]\nengine = 'testserver'\n[[include]]\n{line}\n")
    with pytest.raises(UserError) as caught:
        suites.load(path)
    message = str(caught.value)
    assert message.startswith(f"{path} [[include]] #1: ") and reason in message


def test_isl_0_in_a_suite_file_stops_suite_run_before_anything_runs(tmp_path: Path, capsys) -> None:
    path = tmp_path / "zero.toml"
    path.write_text("[[matrix]]\nengine = 'testserver'\nisl = 0\n")
    assert main(["suite", "run", str(path), "--db", f"sqlite:///{tmp_path / 'k.db'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "isl = 0 must be at least 1" in err
    assert not (tmp_path / "k.db").exists()


def test_a_length_of_0_is_refused_by_the_workload_not_taken_for_the_default() -> None:
    """resolve() used to read 0 as "not given" (`isl or base.isl`) and ran 8,192 tokens."""
    with pytest.raises(UserError, match="isl must be a whole number >= 1, got 0"):
        loader.resolve(None, 0, 8)
    with pytest.raises(UserError, match="osl must be a whole number >= 1, got 0"):
        loader.resolve("8k1k", None, 0)


@pytest.mark.parametrize(("argv", "message"), [
    (["--tp", "0"], "--tp must be at least 1"),
    (["--isl", "0"], "--isl must be at least 1"),
    (["--warmup", "-1"], "--warmup must be at least 0"),
    (["--ready-timeout", "0"], "--ready-timeout must be positive"),
    (["--engine", "vllm"], "not both (--url and --engine)"),
    (["--model", "m" * 300], "--model is 300 characters; a stored name keeps at most 200"),  # before any launch
])
def test_the_command_line_is_checked_by_the_same_declaration(argv: list[str], message: str, capsys) -> None:
    assert main(["sweep", "--url", "http://127.0.0.1:9", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_config_built_by_hand_is_checked_by_the_declaration_too() -> None:
    w = loader.resolve(None, 8, 8)
    with pytest.raises(UserError, match="--trials must be at least 1"):
        SweepConfig(levels=[1], workload=w, trials=0).validate()
    with pytest.raises(UserError, match="--num-prompts must be at least 1"):
        SweepConfig(levels=[1], workload=w, num_prompts=0).validate()
    with pytest.raises(UserError, match="--conc gave no levels"):
        SweepConfig(levels=[], workload=w).validate()
    SweepConfig(levels=[1], workload=w).validate()


def test_defaults_and_the_environment_come_from_the_declaration(monkeypatch) -> None:
    monkeypatch.setenv(settings.API_KEY_ENV, "k")
    cfg = SweepConfig.from_settings({})
    assert cfg.levels == [4, 8, 16, 32, 64, 128] and cfg.workload.name == settings.DEFAULT_WORKLOAD
    assert cfg.api_key == "k" and cfg.timeout_s == settings.default("timeout")
    monkeypatch.delenv(settings.API_KEY_ENV)
    assert SweepConfig.from_settings({}).api_key is None
