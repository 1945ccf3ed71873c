"""Tensor parallel over gloo: TP 2 and TP 4 processes give the TP 1 logits and greedy tokens.

Heads, MLP and expert intermediate dims are split; row-parallel outputs and the MoE combine are
all-reduced, so only the summation order differs from TP 1.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from model_helpers import PagedDriver, tp_worker

from k2bench.net import free_port

pytestmark = pytest.mark.engine

PROMPTS = [[5, 9, 40, 41, 42, 100, 7, 300, 12], [77, 78], [200, 201, 202, 203, 204, 205]]
STEPS = 5


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from k2bench.engine.model.tiny import TinySpec, write_tiny_checkpoint

    spec = TinySpec(layers=3)
    return [
        str(write_tiny_checkpoint(tmp_path_factory.mktemp("tp_bf16"), quant="bf16", seed=11, spec=spec)),
        str(write_tiny_checkpoint(tmp_path_factory.mktemp("tp_mx"), quant="mxfp4", seed=12, spec=spec)),
    ]


def _tp1(model_dir):
    from k2bench.engine.model.loader import load_model

    model, cfg = load_model(model_dir, dtype="float32")
    logits = PagedDriver(model, cfg).prefill_all_logits(0, PROMPTS[0])
    tokens = PagedDriver(model, cfg, seed=7).greedy(PROMPTS, STEPS, chunk=5)
    return logits, tokens


@pytest.mark.parametrize("world", [2, 4])
def test_tp_matches_tp1(world, checkpoints, tmp_path):
    out = tmp_path / "tp.pt"
    # fork: the ranks inherit the imported engine instead of each importing torch again (seconds per
    # process on a busy 2-core box); each worker drops to one intra-op thread first, as DataLoader does.
    jobs = [(d, PROMPTS, STEPS) for d in checkpoints]
    mp.start_processes(tp_worker, args=(world, free_port(), jobs, str(out)), nprocs=world, join=True,
                       start_method="fork")
    results = torch.load(out)
    for d, res in zip(checkpoints, results, strict=True):
        logits, tokens = _tp1(d)
        assert res["tokens"] == tokens, d
        # bf16 weights run in float32: only the all-reduce order differs. A4W4 re-quantises activations,
        # where a last-bit difference can move one element to the neighbouring FP4 code.
        tol = 1e-4 if res["quant_mode"] == "none" else 2e-2
        torch.testing.assert_close(res["logits"], logits, atol=tol, rtol=tol)
    assert [r["quant_mode"] for r in results] == ["none", "a4w4"]
