"""Recipes beyond the built-ins: --server-cmd (custom) and user recipe files."""

from __future__ import annotations

import shlex

import pytest

from k2bench.errors import UserError
from k2bench.harness.cli import main
from k2bench.harness.servers import launch, recipes
from k2bench.harness.store import Store


def test_server_cmd_fills_placeholders_and_records_the_whole_command() -> None:
    r = recipes.custom("myserve --model {model} --tp {tp} --bind {host}:{port} --x 'a b'")
    argv, flags = recipes.render(r, model="m1", tp=4, port=8123, host="0.0.0.0")
    assert argv == ["myserve", "--model", "m1", "--tp", "4", "--bind", "0.0.0.0:8123", "--x", "a b"]
    # recorded as written: the same command on another port records the same flags
    assert flags == ["myserve", "--model", "{model}", "--tp", "{tp}", "--bind", "{host}:{port}", "--x", "a b"]
    assert recipes.render(r, model="m1", tp=4, port=9999)[1] == flags


@pytest.mark.parametrize(("cmd", "message"), [
    ("myserve --port 8000", "must contain {port}"),
    ("myserve --port {port} --gpu {gpu}", "unknown placeholder {gpu}"),
    ("myserve --port {port} 'unclosed", "cannot split"),
    ("   ", "empty"),
])
def test_bad_server_cmd_is_a_user_error(cmd: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        recipes.custom(cmd)


def test_user_file_extends_a_builtin_and_adds_a_new_one(tmp_path) -> None:
    (tmp_path / "vllm.toml").write_text('extends = "vllm"\nflags = ["--max-num-seqs", "256"]\n')
    (tmp_path / "mine.toml").write_text('command = "{python} -m mysrv --port {port}"\nenv = {A = "1"}\n')
    known = recipes.all_recipes(tmp_path)
    vllm = known["vllm"]
    assert vllm.argv == recipes.RECIPES["vllm"].argv and vllm.flags == ("--max-num-seqs", "256")
    assert vllm.source == str(tmp_path / "vllm.toml")
    argv, _ = recipes.render(known["mine"], model="m", tp=1, port=9)
    assert argv[1:] == ["-m", "mysrv", "--port", "9"] and known["mine"].env == {"A": "1"}
    assert recipes.get("mine", tmp_path).name == "mine"
    with pytest.raises(UserError, match=r"unknown engine recipe 'nope'; known: .*mine"):
        recipes.get("nope", tmp_path)


@pytest.mark.parametrize(("text", "message"), [
    ("bogus = 1\n", "unknown field 'bogus'"),
    ('extends = "trt"\n', "extends unknown recipe 'trt'"),
    ('description = "no command"\n', "needs argv"),
    ('command = "srv --listen 80"\n', "must contain {port}"),
    ('command = "srv --port {port}"\nflags = "--x"\n', "flags must be a list"),
    ('command = "srv --port {port}"\nready_timeout_s = -1\n', "positive"),
    ("command = [\n", "recipe file"),
])
def test_bad_recipe_file_names_the_file_and_field(tmp_path, text: str, message: str) -> None:
    (tmp_path / "r.toml").write_text(text)
    with pytest.raises(UserError, match=message):
        recipes.all_recipes(tmp_path)


def test_recipes_command_lists_user_files_and_fails_cleanly(tmp_path, capsys) -> None:
    (tmp_path / "mine.toml").write_text('command = "srv --port {port}"\ndescription = "my engine"\n')
    assert main(["recipes", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for word in ("bundled", "vllm", "mine", "my engine", "custom", "--server-cmd"):
        assert word in out
    (tmp_path / "bad.toml").write_text("x = 1\n")
    assert main(["recipes", "--dir", str(tmp_path)]) == 2
    assert "bad.toml: unknown field 'x'" in capsys.readouterr().err


def test_recipes_command_masks_secrets_and_prints_markup_as_text(tmp_path, capsys) -> None:
    (tmp_path / "hostile.toml").write_text(
        'command = "srv --port {port} --api-key sk-live-0123456789abcdef"\n'
        'description = "[/red] closes a tag that was never opened"\n')
    assert main(["recipes", "--dir", str(tmp_path), "-v"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the table folds long cells over lines
    assert "sk-live-0123456789abcdef" not in out
    assert "[/red]" in out


def test_custom_recipe_launches_from_its_working_directory(tmp_path) -> None:
    (tmp_path / "srv.py").write_text(
        "import runpy, sys\n"
        "sys.argv = ['testserver', *sys.argv[1:]]\n"
        "runpy.run_module('k2bench.harness.load.testserver', run_name='__main__')\n")
    r = recipes.custom("{python} srv.py --port {port} --host {host} --model {model}")
    server = launch.from_recipe(r, model="here", log_dir=tmp_path / "logs", cwd=tmp_path, ready_timeout_s=60)
    with server:
        assert launch._get(server.base_url + "/v1/models", timeout=5) == 200
    assert server.proc is None


def test_sweep_launches_a_server_command(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # server logs go to ./results/logs
    db = f"sqlite:///{tmp_path / 'k.db'}"
    cmd = "{python} -m k2bench.harness.load.testserver --host {host} --port {port} --model {model} --itl-ms 2"
    base = ["sweep", "--server-cmd", cmd, "--model", "tiny-m", "--isl", "8", "--osl", "4", "--conc", "1",
            "--num-prompts", "2", "--warmup", "0", "--db", db, "--commit", "c1"]
    assert main(base) == 0
    with Store.open(db, readonly=True) as store:
        (run,) = store.list_runs()
    assert run["engine"] == "custom" and run["status"] == "complete" and run["model"] == "tiny-m"
    assert run["engine_flags"] == shlex.split(cmd) and "--itl-ms 2" in run["server_command"]
    assert main([*base[:2], cmd.replace("--itl-ms 2", "--itl-ms 3"), *base[3:]]) == 0
    with Store.open(db, readonly=True) as store:
        assert len({r["fingerprint"] for r in store.list_runs()}) == 2  # another command, another config
    assert main(["sweep", "--server-cmd", cmd, "--engine", "vllm", "--db", db]) == 2
    assert "not both" in capsys.readouterr().err

