"""A backfill or bisect of a server given a local model folder (--model DIR) finds its own runs: the
bench expects the model as the sweep records it, by the folder's name and the precision its
config declares (before, it expected the path and no precision, so no stored run ever matched)."""

from __future__ import annotations

import json

from k2bench.harness.history.backfill import CommitBench
from k2bench.harness.record.fingerprint import fingerprint
from k2bench.harness.run.sweep import SweepConfig
from k2bench.workloads.loader import Workload


def test_a_model_folder_is_expected_by_its_name_and_declared_precision(tmp_path) -> None:
    folder = tmp_path / "models" / "kimi-small"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "quark",
                                                                            "weight": {"dtype": "fp4"}}}))
    cfg = SweepConfig(levels=[2], workload=Workload(name="w", isl=8, osl=4), model=str(folder), hardware="cpu")
    bench = CommitBench(repo=tmp_path, server_cmd="{python} serve.py --port {port}", cfg=cfg)
    meta = bench.expected_meta()
    assert (meta["model"], meta["precision"]) == ("kimi-small", "mxfp4")
    # what an attached sweep of that folder records (run.sweep._describe_run) has the same fingerprint
    recorded = {**meta, "model": folder.name, "precision": "mxfp4"}
    assert bench.fingerprint == fingerprint(recorded)
    # a model id (not a folder) and an explicit precision are kept as given
    by_id = CommitBench(repo=tmp_path, server_cmd="{python} serve.py --port {port}",
                        cfg=SweepConfig(levels=[2], workload=Workload(name="w", isl=8, osl=4), model="org/model",
                                        precision="bf16", hardware="cpu"))
    assert (by_id.expected_meta()["model"], by_id.expected_meta()["precision"]) == ("org/model", "bf16")
