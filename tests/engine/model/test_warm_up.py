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
def test_the_mlp_warm_up_runs_each_kind_of_layer_as_a_step_feeds_it(tmp_path, monkeypatch, quant_mode):
    """The warm-up's calls on CPU (the serving engine makes them only on a GPU, where Triton compiles): the
    first MoE and the first dense layer, at every count, fed as DecoderLayer.forward feeds them (A4W4 input
    from the norm when the MLP takes it), and each MLP's local part is its forward on one rank."""
    import torch

    from k2bench.engine.model.loader import load_model
    from k2bench.engine.model.moe import DenseMLP, MoE
    from k2bench.engine.model.tiny import write_tiny_checkpoint

    d = write_tiny_checkpoint(tmp_path / "tiny", quant="mxfp4")
    model, cfg = load_model(d, dtype="float32", quant_mode=quant_mode)
    assert {type(layer.mlp) for layer in model.layers} == {MoE, DenseMLP}  # both kinds, as in Kimi-K2
    calls = []

    def spying(kind):
        real = kind.local

        def local(self, x, xq=None):
            calls.append((self, x.shape[0], xq is not None, self.takes_quantized))
            return real(self, x, xq)
        return local

    for kind in (MoE, DenseMLP):
        monkeypatch.setattr(kind, "local", spying(kind))
    counts = warm_up_token_counts(40)
    assert model.warm_up_mlps(40) == 2 * len(counts)
    for kind in (MoE, DenseMLP):  # the first layer of each kind (a MoE's shared experts call DenseMLP too)
        first = next(layer.mlp for layer in model.layers if isinstance(layer.mlp, kind))
        mine = [c for c in calls if c[0] is first]
        assert [c[1] for c in mine] == counts
        assert all(quantized == takes for _, _, quantized, takes in mine)
    assert any(c[3] for c in calls) == (quant_mode == "a4w4")
    monkeypatch.undo()
    assert model.warm_up(64, 40) == 0  # on CPU: no attention plans, no variants to compile
    x = torch.randn(5, cfg.hidden_size)
    for layer in model.layers:
        assert torch.equal(layer.mlp.local(x), layer.mlp(x))  # one rank: the all-reduce is the identity
