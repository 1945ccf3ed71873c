"""Decode CUDA graphs: replayed steps give the eager engine's tokens (GPU), and the switch is plumbed (CPU).

The GPU test runs the whole runtime (scheduler, chunked prefill, batching that grows and shrinks
through several graph buckets) on the tiny MXFP4 model in float32 with the triton backend, eager and
with graphs, each with and without steps launched ahead of reading the last one's tokens, and needs
identical greedy tokens and graph replays actually used;
a second runs prompts sharing prefixes with prefix caching on and off under graphs; a third checks that
nothing compiles once the engine has warmed up.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.engine

LENGTHS = [5, 17, 64, 300, 2, 40, 9]


def _generate(model_dir, *, graphs: bool, device: str, backend: str, overlap: bool = True):
    from k2bench.engine.runtime.build import EngineOptions, build_engine
    from k2bench.engine.runtime.runtime_config import RuntimeConfig
    from k2bench.engine.runtime.sequence import SamplingParams, Sequence

    rt = RuntimeConfig(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=1024, block_size=16,
                       num_kv_blocks=256, cuda_graphs=graphs, async_scheduling=overlap)
    eng = build_engine(EngineOptions(model=str(model_dir), device=device, dtype="float32", backend=backend, runtime=rt))
    g = torch.Generator().manual_seed(7)
    # different output lengths, so the decode batch shrinks through the buckets as requests finish
    seqs = [Sequence(torch.randint(10, 500, (n,), generator=g).tolist(),
                     SamplingParams(temperature=0, max_tokens=6 + 3 * i, ignore_eos=True))
            for i, n in enumerate(LENGTHS)]
    eng.generate(seqs)
    assert (eng.stats.steps_ahead > 10) == overlap, eng.stats
    return [s.output_token_ids for s in seqs], eng.runner.graphs


@pytest.mark.gpu
def test_graph_replay_matches_eager(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from k2bench.engine.model.tiny import write_tiny_checkpoint

    d = write_tiny_checkpoint(tmp_path / "tiny", quant="mxfp4", seed=11)
    eager, none = _generate(d, graphs=False, device="cuda", backend="triton", overlap=False)
    replayed, graphs = _generate(d, graphs=True, device="cuda", backend="triton", overlap=False)
    assert none is None and graphs is not None
    assert graphs.replays > 10
    assert replayed == eager
    # steps launched ahead take their input ids from the previous step's samples on the device
    ahead_replayed, graphs = _generate(d, graphs=True, device="cuda", backend="triton")
    assert graphs.replays > 10
    assert ahead_replayed == eager
    ahead_eager, _ = _generate(d, graphs=False, device="cuda", backend="triton")
    assert ahead_eager == eager


@pytest.mark.gpu
def test_prefix_caching_under_graph_replay_gives_the_uncached_tokens(tmp_path):
    """Decode graphs read block tables as data, so rows sharing cached blocks replay like any other; the
    prefill after a cached prefix runs eagerly. Caching on and off must give the same greedy tokens."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from test_prefix_cache_model import run

    from k2bench.engine.model.tiny import write_tiny_checkpoint

    d = write_tiny_checkpoint(tmp_path / "tiny", quant="mxfp4", seed=5)
    off, _, _ = run(d, caching=False, tp=1, device="cuda", backend="triton", graphs=True)
    on, cached, graphs = run(d, caching=True, tp=1, device="cuda", backend="triton", graphs=True)
    assert graphs is not None and graphs.replays > 10
    assert sum(cached) > 0
    assert on == off


def test_graphs_stay_off_on_cpu_and_enforce_eager_switches_them_off(tmp_path):
    from k2bench.engine.model.tiny import write_tiny_checkpoint
    from k2bench.engine.runtime.runtime_config import RuntimeConfig
    from k2bench.harness.cli import build_parser

    assert RuntimeConfig().cuda_graphs is True
    args = build_parser().parse_args(["serve", "--model", "m", "--enforce-eager"])
    assert args.cuda_graphs is False
    assert build_parser().parse_args(["serve", "--model", "m"]).cuda_graphs is None  # the config default
    d = write_tiny_checkpoint(tmp_path / "tiny", quant="mxfp4", seed=11)
    tokens, graphs = _generate(d, graphs=True, device="cpu", backend="torch")
    assert graphs is None and all(len(t) > 0 for t in tokens)


@pytest.mark.gpu
def test_nothing_compiles_after_warm_up(tmp_path):
    """After the engine's warm-up (and graph capture), serving prompts of many lengths in growing and
    shrinking batches compiles no Triton kernel: Triton's own compile hook counts them (server_process)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from k2bench.engine.model.tiny import write_tiny_checkpoint
    from k2bench.engine.runtime.build import EngineOptions, build_engine
    from k2bench.engine.runtime.runtime_config import RuntimeConfig
    from k2bench.engine.runtime.sequence import SamplingParams, Sequence
    from k2bench.engine.runtime.server_process import JitCompiles

    jit = JitCompiles().install()
    d = write_tiny_checkpoint(tmp_path / "tiny", quant="mxfp4", seed=3)
    rt = RuntimeConfig(max_num_seqs=16, max_num_batched_tokens=512, max_model_len=2048, block_size=16,
                       num_kv_blocks=1024)
    eng = build_engine(EngineOptions(model=str(d), device="cuda", dtype="float32", backend="triton", runtime=rt))
    eng.warm_up()
    jit.ready()
    g = torch.Generator().manual_seed(1)
    lengths = [1, 3, 16, 17, 100, 511, 512, 513, 1500, 7, 250, 33, 64, 65, 900, 2]
    seqs = [Sequence(torch.randint(10, 500, (n,), generator=g).tolist(),
                     SamplingParams(temperature=0, max_tokens=4 + 5 * (i % 4), ignore_eos=True))
            for i, n in enumerate(lengths)]
    eng.generate(seqs)
    assert all(s.output_token_ids for s in seqs)
    assert jit.count == 0, f"{jit.count} kernels compiled after warm-up (see the log)"
