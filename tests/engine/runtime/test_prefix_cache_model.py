"""Prefix caching on the tiny MXFP4 checkpoint: greedy tokens with caching on equal those with it off,
at TP 1 and TP 2 (gloo, real worker processes), for prompts that share prefixes of several lengths.

Only rank 0 schedules: the workers receive block tables and slots, so the cache's decisions are the
same on every rank by construction; this checks the KV each rank keeps in a shared block is right.
"""

from __future__ import annotations

import random

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.slow]

BLOCK = 16
SHARED = (0, 7, 16, 23, 32, 50, 64)  # prefix lengths shared with the first prompt: aligned and not


@pytest.fixture
def one_thread():
    """One torch thread in this process: on a busy shared machine, two threads contending for cores make
    the tiny model's small matmuls some thirty times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from k2bench.engine.model.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("pc") / "tiny", quant="mxfp4", seed=5)


def prompts() -> list[list[int]]:
    rng = random.Random(17)
    base = [rng.randrange(10, 500) for _ in range(64)]
    return [base + [rng.randrange(10, 500) for _ in range(9)]] + [
        base[:k] + [rng.randrange(10, 500) for _ in range(rng.randrange(1, 20))] for k in SHARED]


def run(model_dir, *, caching: bool, tp: int, device: str = "cpu", backend: str = "auto",
        graphs: bool = False) -> tuple[list[list[int]], list[int | None], object]:
    """The first prompt alone, then the others in one batch (they find its blocks); then all again,
    so the second round also shares the first round's answers."""
    from k2bench.engine.runtime.build import EngineOptions, build_engine
    from k2bench.engine.runtime.runtime_config import RuntimeConfig
    from k2bench.engine.runtime.sequence import SamplingParams, Sequence

    rt = RuntimeConfig(max_num_seqs=8, max_num_batched_tokens=96, max_model_len=512, block_size=BLOCK,
                       num_kv_blocks=96, enable_prefix_caching=caching, cuda_graphs=graphs)
    eng = build_engine(EngineOptions(model=str(model_dir), device=device, dtype="float32", backend=backend,
                                     tp=tp, runtime=rt))
    try:
        ps = prompts()
        out, cached = [], []
        for _round in range(2):
            seqs = [Sequence(p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)) for p in ps]
            eng.generate(seqs[:1])
            eng.generate(seqs[1:])
            out += [s.output_token_ids for s in seqs]
            cached += [s.num_cached_tokens for s in seqs]
        assert eng.scheduler.blocks.num_free == rt.num_kv_blocks
        return out, cached, eng.runner.graphs
    finally:
        eng.shutdown()


@pytest.mark.parametrize("tp", [1, 2])
def test_greedy_tokens_are_the_same_with_caching_on_and_off(tiny, tp, one_thread):
    off, cached_off, _ = run(tiny, caching=False, tp=tp)
    on, cached_on, _ = run(tiny, caching=True, tp=tp)
    assert on == off
    assert all(len(t) == 8 for t in on)
    assert cached_off == [0] * len(off)
    # round 1: whole blocks of the prefix shared with the first prompt; round 2: every prompt was seen,
    # so all its full blocks but the one holding its last token are found
    n = len(SHARED) + 1
    lens = [len(p) for p in prompts()]
    assert cached_on[:n] == [0] + [k // BLOCK * BLOCK for k in SHARED]
    assert cached_on[n:] == [(m - 1) // BLOCK * BLOCK for m in lens]
