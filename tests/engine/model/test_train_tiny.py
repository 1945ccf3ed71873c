"""The trained tiny model: deterministic, exported in the engine's real MXFP4 format, right when served
in W4 and A4W4, and wrong (at unchanged cost) when a test fault breaks the MXFP4 scales."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
from test_runtime_server import Server  # noqa: E402

pytest.importorskip("transformers")
pytestmark = [pytest.mark.engine]


def _train(out: Path, **spec) -> dict:
    from k2bench.engine.model.train_tiny import TrainSpec, train_tiny

    return train_tiny(out, "tiny-arith", TrainSpec(**spec))


@pytest.mark.timeout(900)  # two short trainings; minutes on a loaded 2-core machine
def test_training_is_deterministic_and_writes_quark_mxfp4(tmp_path):
    from safetensors import safe_open

    a = _train(tmp_path / "a", steps=3, batch=8)
    _train(tmp_path / "b", steps=3, batch=8)
    files = sorted(p.name for p in (tmp_path / "a").glob("*.safetensors"))
    assert files and files == sorted(p.name for p in (tmp_path / "b").glob("*.safetensors"))
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "quark" and cfg["num_hidden_layers"] == 2
    dtypes = {}
    for name in files:
        with safe_open(str(tmp_path / "a" / name), "pt") as fh:
            dtypes.update({k: fh.get_tensor(k).dtype for k in fh.keys()})
    # experts packed as FP4 + E8M0, attention kept in bf16, as in the real Kimi-K2.5 MXFP4 checkpoint
    assert dtypes["model.layers.1.mlp.experts.3.down_proj.weight"] == dtypes["model.layers.1.mlp.experts.3.down_proj.weight_scale"]
    assert str(dtypes["model.layers.1.mlp.experts.3.down_proj.weight"]) == "torch.uint8"
    assert str(dtypes["model.layers.0.self_attn.kv_b_proj.weight"]) == "torch.bfloat16"
    assert a["steps"] == 3 and (tmp_path / "a" / "training.json").is_file()


@pytest.mark.timeout(900)
def test_the_cache_keeps_a_model_of_the_same_spec_and_retrains_another(tmp_path):
    """The cache the default sweep and the tests share: reused only when trainer version, settings and
    data match; anything else (another spec, a damaged training.json) is trained again, whole."""
    from dataclasses import replace

    from k2bench.engine.model.train_tiny import TrainSpec, cached_model

    spec = TrainSpec(steps=2, batch=4)
    out, trained = cached_model(tmp_path / "m", "tiny-arith", spec)
    assert trained and json.loads((out / "training.json").read_text())["steps"] == 2
    shard = sorted(out.glob("*.safetensors"))[0]
    stamp = shard.stat().st_mtime_ns
    assert cached_model(out, "tiny-arith", spec) == (out, False) and shard.stat().st_mtime_ns == stamp
    assert cached_model(out, "tiny-arith", replace(spec, steps=3))[1]
    assert json.loads((out / "training.json").read_text())["steps"] == 3
    (out / "training.json").write_text("{not json")
    assert cached_model(out, "tiny-arith", replace(spec, steps=3))[1]
    assert not (tmp_path / "m.training").exists()  # trained beside the cache, then moved into place


def test_cli_refuses_training_options_it_cannot_honour(tmp_path, capsys):
    from k2bench.harness.cli import main

    assert main(["engine", "tiny", "--out", str(tmp_path), "--task", "tiny-arith", "--quant", "bf16"]) == 2
    assert main(["engine", "tiny", "--out", str(tmp_path), "--steps", "5"]) == 2
    assert main(["engine", "tiny", "--out", str(tmp_path), "--task", "tiny-arith", "--steps", "0"]) == 2
    assert main(["engine", "tiny", "--out", str(tmp_path), "--reuse"]) == 2
    err = capsys.readouterr().err
    assert err.count("k2bench: error:") == 4 and "Traceback" not in err


@pytest.fixture(scope="module")
def trained() -> Path:
    """The default training run, as the default sweep gets it: the cached model (tests/conftest.py's
    K2BENCH_MODELS), trained through the CLI by the first test that needs it."""
    from k2bench.harness.servers.launch import ensure_tiny_model

    out = ensure_tiny_model()
    summary = json.loads((out / "training.json").read_text())
    assert summary["task"] == "tiny-arith" and summary["steps"] > 0
    return out


def _eval(server: Server, tmp_path: Path, name: str) -> tuple[int, dict]:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, "-m", "k2bench.harness.cli", "eval", "--url", server.url, "--task",
                           "tiny-arith", "--min-accuracy", "0.95", "--json", str(out)], capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return proc.returncode, json.loads(out.read_text())




@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first user of `trained` pays for the training run
@pytest.mark.parametrize("mode", ["w4", "a4w4"])
def test_trained_model_served_in_mxfp4_is_right(trained, tmp_path, mode):
    pytest.importorskip("lm_eval")
    server = Server(trained, "--quant-mode", mode)
    try:
        rc, doc = _eval(server, tmp_path, mode)
    finally:
        server.stop()
    assert doc["n"] == 500 and doc["value"] >= 0.95, doc["value"]  # the target, in W4 and A4W4
    assert rc == 0  # --min-accuracy 0.95 passes


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_scale_fault_breaks_accuracy_not_the_work(trained, tmp_path, monkeypatch):
    """One exponent off in every E8M0 scale: same tensors, shapes and kernels, wrong numbers."""
    pytest.importorskip("lm_eval")
    from k2bench.engine.model import faults
    from k2bench.engine.model.loader import load_model

    clean = {k: v.clone() for k, v in load_model(trained, dtype="float32")[0].state_dict().items()}
    monkeypatch.setenv(faults.SCALE_SHIFT_ENV, "1")
    broken = load_model(trained, dtype="float32")[0].state_dict()
    assert {k: (v.shape, v.dtype) for k, v in broken.items()} == {k: (v.shape, v.dtype) for k, v in clean.items()}
    changed = {k for k in clean if not clean[k].equal(broken[k])}
    assert changed and all("scale" in k for k in changed)
    for k in changed:
        assert (broken[k].int() - clean[k].int()).eq(1).all()

    server = Server(trained, "--quant-mode", "w4")  # inherits the fault; clean W4 scores 0.97
    try:
        rc, doc = _eval(server, tmp_path, "fault")
    finally:
        log = server.stop()
    assert rc == 1 and doc["value"] < 0.95, doc["value"]
    assert faults.SCALE_SHIFT_ENV in log  # the server says loudly that it runs with the fault


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_scale_fault_fails_the_pr_gate_on_accuracy(trained, tmp_path, monkeypatch, capsys):
    """The issue's whole story through the CLI: two sweeps of the bundled engine with their evaluations,
    the second with the scale fault, then `k2bench regress` between them: it fails, on accuracy."""
    pytest.importorskip("lm_eval")
    from k2bench.engine.model import faults
    from k2bench.harness.cli import main

    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path}/k2.db"
    sweep = ["sweep", "--model", str(trained), "--server-args=--quant-mode w4", "--isl", "32", "--osl", "8",
             "--conc", "2", "--num-prompts", "6", "--warmup", "1", "--eval", "tiny-arith@8", "--eval-limit", "200",
             "--db", db]
    assert main([*sweep, "--json", "clean.json"]) == 0, capsys.readouterr().err
    monkeypatch.setenv(faults.SCALE_SHIFT_ENV, "1")  # the launched server inherits it
    assert main([*sweep, "--json", "fault.json"]) == 0, capsys.readouterr().err
    clean, fault = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("clean", "fault"))
    assert clean["evals"][0]["value"] >= 0.95 > fault["evals"][0]["value"]
    assert fault["run"]["status"] == clean["run"]["status"] == "complete"  # the fault costs no requests
    from k2bench.harness.store import Store

    with Store.open(db, readonly=True) as store:
        base_id, cand_id = sorted(r["id"] for r in store.list_runs())
    capsys.readouterr()

    code = main(["regress", "--candidate", str(cand_id), "--baseline", str(base_id),
                 "--db", db, "--fail-on-regression", "--json", "verdict.json"])
    text = capsys.readouterr().out
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert code == 1 and verdict["overall"] == "regression"
    (acc,) = verdict["accuracy"]
    assert acc["task"] == "tiny-arith" and acc["status"] == "regression" and acc["n_candidate"] == 200
    assert [v for v in verdict["verdicts"] if v["status"] == "regression"] == []  # speed is not blamed
    assert "tiny-arith" in next(line for line in text.splitlines() if "Regression" in line)
