"""Other tools' results as runs: each mapping checked on a file in that tool's own format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k2bench.errors import UserError
from k2bench.harness import importers
from k2bench.harness.cli import main
from k2bench.harness.importers import aiperf, inferencex
from k2bench.harness.store import Store

FIX = Path(__file__).parent / "fixtures"
VLLM = [FIX / "vllm-inf-concurrency4-Qwen3-0.6B.json", FIX / "vllm-inf-concurrency8-Qwen3-0.6B.json"]


def test_vllm_files_become_one_run_with_a_level_each(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    assert main(["import", "--from", "vllm", *map(str, VLLM), "--db", db, "--engine", "vllm",
                 "--hardware", "H200", "--tag", "team=serving"]) == 0
    assert capsys.readouterr().out.strip().endswith("as run 1 (2 levels)")
    with Store.open(db, readonly=True) as store:
        (run,) = store.list_runs()
        doc = store.export_run(run["id"])
    assert run["engine"] == "vllm" and run["model"] == "Qwen/Qwen3-0.6B" and run["num_gpus"] == 2  # metadata tp=2
    assert run["hardware"] == "H200" and run["tags"] == {"team": "serving", "imported_from": "vllm"}
    assert run["isl"] is None and run["osl"] is None  # vLLM's result does not record the requested lengths
    p4, p8 = doc["points"]
    raw = json.loads(VLLM[0].read_text())
    assert (p4["concurrency"], p8["concurrency"]) == (4, 8)
    assert p4["num_prompts"] == p4["completed"] == 40 and p4["failed"] == 0
    assert p4["tput_per_gpu"] == pytest.approx(raw["total_token_throughput"] / 2)
    assert p4["output_tput_per_gpu"] == pytest.approx(raw["output_throughput"] / 2)
    assert p4["input_tput_per_gpu"] == pytest.approx((raw["total_token_throughput"] - raw["output_throughput"]) / 2)
    assert p4["ttft_ms"]["median"] == 118.0 and p4["ttft_ms"]["p99"] == 150.3 and p4["tpot_ms"]["std"] == 0.9
    assert p4["ttft_ms"]["p90"] is None and p4["ttft_ms"]["p99.9"] is None  # not among --metric-percentiles
    assert all(v is None for v in p4["e2el_ms"].values())  # e2el not among --percentile-metrics
    assert p4["interactivity"]["median"] == pytest.approx(1000 / 14.5)
    assert p4["duration_s"] == 20.0 and p4["input_tokens"] == 40 * 1024


def test_vllm_speculative_decoding_figures_are_imported(tmp_path) -> None:
    """A result file of a speculating server (EAGLE-3, 3 draft tokens): 1800 drafts, 5400 draft tokens,
    3240 accepted -> 1 + 3240 / 1800 = 2.8 tokens per step, 3240 / 5400 = 0.6 of the drafts; vLLM writes
    the rate as a percentage. A file without speculation keeps both null."""
    db = f"sqlite:///{tmp_path / 'k.db'}"
    spec = FIX / "vllm-eagle3-concurrency4-Qwen3-0.6B.json"
    assert main(["import", "--from", "vllm", str(spec), "--db", db]) == 0
    assert main(["import", "--from", "vllm", str(VLLM[0]), "--db", db]) == 0
    with Store.open(db, readonly=True) as store:
        (eagle,), (plain,) = (store.export_run(r["id"])["points"] for r in sorted(store.list_runs(), key=lambda r: r["id"]))
        frame = store.points_frame()
    assert eagle["spec_accept_len"] == pytest.approx(2.8) and eagle["spec_accept_rate"] == pytest.approx(0.6)
    assert plain["spec_accept_len"] is None and plain["spec_accept_rate"] is None
    assert list(frame["spec_accept_len"].dropna()) == pytest.approx([2.8])  # a stored column, for the gate


def test_vllm_speculation_figures_out_of_range_are_refused(tmp_path) -> None:
    raw = json.loads((FIX / "vllm-eagle3-concurrency4-Qwen3-0.6B.json").read_text())
    for over, message in [({"spec_decode_accepted_tokens": 6000}, "more than spec_decode_draft_tokens"),
                          ({"spec_decode_draft_tokens": None, "spec_decode_acceptance_rate": 0.6 * 100 * 2},
                           "a percentage"),
                          ({"spec_decode_num_drafts": None, "spec_decode_acceptance_length": 0.5}, "at least one")]:
        path = tmp_path / "r.json"
        path.write_text(json.dumps({**raw, **over}))
        with pytest.raises(UserError, match=message):
            importers.to_documents("vllm", [path], importers.ImportOptions(gpus=1))


def test_vllm_without_gpu_count_or_concurrency_is_refused(tmp_path, capsys) -> None:
    raw = json.loads(VLLM[0].read_text())
    del raw["tp"]
    (tmp_path / "a.json").write_text(json.dumps(raw))
    assert main(["import", "--from", "vllm", str(tmp_path / "a.json"), "--db", f"sqlite:///{tmp_path}/k.db"]) == 2
    assert "give --gpus N" in capsys.readouterr().err
    raw["max_concurrency"] = None
    (tmp_path / "b.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match="--max-concurrency"):
        importers.to_documents("vllm", [tmp_path / "b.json"], importers.ImportOptions(gpus=1))
    with pytest.raises(UserError, match="not a `vllm bench serve"):
        importers.to_documents("vllm", [FIX / "profile_export_aiperf.json"], importers.ImportOptions(gpus=1))
    assert not (tmp_path / "k.db").exists() or Store.open(f"sqlite:///{tmp_path}/k.db").list_runs() == []


def test_aiperf_export_maps_its_names_and_units(tmp_path) -> None:
    (doc,) = importers.to_documents("aiperf", [FIX / "profile_export_aiperf.json"], importers.ImportOptions(gpus=1))
    run, (p,) = doc["run"], doc["points"]
    assert run["model"] == "Qwen/Qwen3-0.6B" and (run["isl"], run["osl"]) == (550, 128) and run["engine"] == "unknown"
    assert p["concurrency"] == 8 and p["completed"] == 64 and p["failed"] == 0 and p["num_prompts"] == 64
    assert p["tpot_ms"]["median"] == 4.41  # AIPerf's inter_token_latency is TPOT
    assert p["itl_ms"]["p99"] == 6.20  # and its inter_chunk_latency is ITL
    assert p["e2el_ms"]["mean"] == 612.4 and p["ttft_ms"]["p90"] == 52.3
    assert p["ttft_ms"]["p99.9"] is None
    assert p["output_tput_per_gpu"] == 1638.4
    assert p["tput_per_gpu"] == pytest.approx(35200 / 5.0 + 1638.4)
    assert p["duration_s"] == 5.0 and p["output_tokens"] == 8192


def test_aiperf_seconds_are_converted_and_unknown_units_refused(tmp_path) -> None:
    raw = json.loads((FIX / "profile_export_aiperf.json").read_text())
    raw["time_to_first_token"] = {"unit": "s", "avg": 0.0452, "p50": 0.044}
    (tmp_path / "s.json").write_text(json.dumps(raw))
    p = aiperf.read(tmp_path / "s.json", importers.ImportOptions(gpus=1)).point
    assert p["ttft_ms"]["median"] == pytest.approx(44.0) and p["ttft_ms"]["mean"] == pytest.approx(45.2)
    raw["time_to_first_token"]["unit"] = "fortnights"
    (tmp_path / "u.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match="unit 'fortnights'"):
        aiperf.read(tmp_path / "u.json", importers.ImportOptions(gpus=1))


def test_inferencex_result_maps_seconds_back_to_ms_and_keeps_counts_missing() -> None:
    path = FIX / "agg_kimik2.5_fp4_atom_tp4_conc4_isl8192_osl1024.json"
    level = inferencex.read(path, importers.ImportOptions())
    run, p = level.run, level.point
    assert (run["engine"], run["model"], run["precision"], run["hardware"]) == \
        ("atom", "amd/Kimi-K2.5-MXFP4", "fp4", "mi355x")
    assert (run["num_gpus"], run["tp"], run["isl"], run["osl"]) == (4, 4, 8192, 1024)
    assert run["extra"]["started_at_from"] == "file modification time"
    assert p["concurrency"] == 4 and p["tput_per_gpu"] == 1024.6
    assert p["tpot_ms"]["median"] == pytest.approx(8.591) and p["e2el_ms"]["p99"] == pytest.approx(9650.0)
    assert p["interactivity"]["median"] == pytest.approx(116.4, abs=0.05)  # the design card's reference point
    assert p["num_prompts"] is None and p["completed"] is None and p["failed"] is None
    assert "duration_s" not in p and "output_tokens" not in p


def test_inferencex_result_is_stored_with_its_counts_missing(tmp_path, capsys) -> None:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    path = FIX / "agg_kimik2.5_fp4_atom_tp4_conc4_isl8192_osl1024.json"
    assert main(["import", "--from", "inferencex", str(path), "--db", db]) == 0
    with Store.open(db, readonly=True) as store:
        (run,) = store.list_runs()
        doc = store.export_run(run["id"])
    (p,) = doc["points"]
    assert p["num_prompts"] is None and p["completed"] is None and p["failed"] is None
    assert p["tput_per_gpu"] == 1024.6 and run["engine"] == "atom" and run["num_gpus"] == 4
    capsys.readouterr()
    assert main(["show", str(run["id"]), "--db", db]) == 0
    assert "1,024" in capsys.readouterr().out


def test_counts_are_all_given_or_all_missing() -> None:
    from k2bench.harness.record import runjson

    doc = importers.to_documents("vllm", [VLLM[0]], importers.ImportOptions())
    point = dict(doc[0]["points"][0], completed=None)
    with pytest.raises(UserError, match="given together or all null"):
        runjson.validate_point(point)
