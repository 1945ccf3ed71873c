"""The engine's warm-up token counts meet every size regime the MoE kernels pick their compiled variants
by, so no regime is first met (and compiled, with every stream waiting) while serving. Checked against
every token count a step can carry, with the kernels' own choosers (tiles, scaled tiles, alignment chunk)."""

from __future__ import annotations

import pytest
import triton

from k2bench.engine.kernels.moe_dispatch import fast_tiles, scaled_tiles
from k2bench.engine.kernels.triton_moe_glue import ALIGN_MAX_CHUNKS, ALIGN_MIN_CHUNK
from k2bench.engine.model.deepseek import warm_up_token_counts


def regime(tokens: int, top_k: int, experts: int) -> tuple:
    pairs = tokens * top_k
    chunk = max(ALIGN_MIN_CHUNK, triton.next_power_of_2(triton.cdiv(pairs, ALIGN_MAX_CHUNKS)))
    return fast_tiles(pairs, experts), scaled_tiles(pairs, experts), chunk


@pytest.mark.parametrize("max_tokens,top_k,experts", [(8192, 8, 384), (8192, 8, 256), (2048, 8, 384),
                                                      (512, 2, 8), (8192, 6, 64), (100, 8, 384)])
def test_the_counts_meet_every_regime_a_step_can(max_tokens, top_k, experts):
    counts = warm_up_token_counts(max_tokens)
    assert counts[0] == 1 and counts[-1] == max_tokens and counts == sorted(set(counts))
    every = {regime(t, top_k, experts) for t in range(1, max_tokens + 1)}
    warmed = {regime(t, top_k, experts) for t in counts}
    assert warmed == every
    assert len(counts) < 16 * max_tokens.bit_length() + 16  # a few hundred calls at most, not every count


def test_no_counts_below_one():
    assert warm_up_token_counts(0) == []
    assert warm_up_token_counts(5) == [1, 2, 3, 4, 5]


@pytest.mark.engine
@pytest.mark.parametrize("quant_mode", ["w4", "a4w4"])
def test_the_moe_warm_up_runs_the_layer_as_a_step_feeds_it(tmp_path, quant_mode):
    """The warm-up's calls on CPU (the serving engine makes them only on a GPU, where Triton compiles): the
    first MoE layer fed as DecoderLayer.forward feeds it, A4W4 input from the norm included, and its
    local part plus the all-reduce is the layer's forward."""
    import torch

    from k2bench.engine.model.deepseek import DecoderLayer
    from k2bench.engine.model.loader import load_model
    from k2bench.engine.model.moe import MoE
    from k2bench.engine.model.tiny import write_tiny_checkpoint

    d = write_tiny_checkpoint(tmp_path / "tiny", quant="mxfp4")
    model, cfg = load_model(d, dtype="float32", quant_mode=quant_mode)
    layer = next(m for m in model.layers if isinstance(m, DecoderLayer) and isinstance(m.mlp, MoE))
    assert layer.mlp.takes_quantized == (quant_mode == "a4w4")
    assert model.warm_up_moe(40) == len(warm_up_token_counts(40))
    assert model.warm_up(64, 40) == 0  # on CPU: no attention plans, no MoE variants to compile
    x = torch.randn(5, cfg.hidden_size)
    assert torch.equal(layer.mlp.local(x), layer.mlp(x))  # one rank: the all-reduce is the identity
