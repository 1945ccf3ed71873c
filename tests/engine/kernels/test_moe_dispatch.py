"""The MoE dispatch table (engine/kernels/moe_dispatch.py): which family and tiles run at the engine's shapes
(Kimi-K2.5 width: E=384, top 8), and the one split-K rule. No kernel runs here."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.engine

pytest.importorskip("triton")

from k2bench.engine.kernels import moe_dispatch as md  # noqa: E402  (after the importorskip)


def test_fast_tiles_by_pairs_per_expert():
    decode, batched, prefill = md.FAST_TILES["decode"], md.FAST_TILES["batched"], md.FAST_TILES["prefill"]
    for tokens in (1, 4, 32, 128, 768):  # up to 16 pairs per expert
        assert md.fast_tiles(tokens * 8, 384) == decode, tokens
    assert md.fast_tiles(769 * 8, 384) == batched
    assert md.fast_tiles(1024 * 8, 384) == batched
    assert md.fast_tiles(6143 * 8, 384) == batched  # 127.98 pairs per expert
    assert md.fast_tiles(6144 * 8, 384) == prefill
    assert md.fast_tiles(8192 * 8, 384) == prefill
    # the measured rows: decode keeps the activation prefetch, prefill drops it; 128 weight rows throughout
    assert decode.prefetch and batched.prefetch and not prefill.prefetch
    assert {t.block_n for t in md.FAST_TILES.values()} == {128}
    assert (decode.block_m, batched.block_m, prefill.block_m) == (16, 32, 64)
    assert md.fast_tiles(3, 1) == decode  # the dense MLP as one expert: 3 rows
    # chunks per K step (gate/up, down): down two everywhere; gate/up one at decode sizes, two at prefill
    assert (decode.step_chunks(), batched.step_chunks(), prefill.step_chunks()) == ((1, 2), (1, 2), (2, 2))


def test_fast_tiles_refuse_steps_the_kernels_do_not_take():
    assert md.FastTiles(16, 128, 4, 3, True, chunks=2).step_chunks() == (2, 2)  # down follows gate/up by default
    for bad in ({"chunks": 4}, {"chunks": 0}, {"down_chunks": 3}):
        with pytest.raises(ValueError, match="chunks must be one of"):
            md.FastTiles(16, 128, 4, 3, True, **bad)


def test_scaled_tiles_by_pairs():
    assert md.scaled_tiles(4 * 8, 384) == md.ScaledTiles(16, 64, 4, None)  # decode, below 256 pairs
    assert md.scaled_tiles(32 * 8, 384) == md.ScaledTiles(16, 128, 4, 3)  # 256 pairs: 128 columns
    assert md.scaled_tiles(1024 * 8, 384).block_m == 32  # 21 pairs per expert
    assert md.scaled_tiles(4096 * 8, 384).block_m == 64  # 85 pairs per expert
    assert md.scaled_tiles(8192 * 8, 384) == md.ScaledTiles(128, 128, 8, 3)  # prefill
    assert md.scaled_tiles(40, 8) == md.ScaledTiles(16, 64, 4, None)  # small test shapes: narrow columns


def test_kernel_family_by_device():
    assert md.moe_kernel(torch.device("cpu")) == "dot_scaled"  # the interpreter counts as FP4-native
    assert md.native_fp4(torch.device("cpu"))
    assert set(md.MOE_KERNELS) == {"fast", "dot_scaled"}


def test_split_k_fills_the_gpu_and_keeps_slices_long():
    assert md.split_k(md.SPLIT_TARGET_PROGRAMS, 56) == 1  # enough programs already
    assert md.split_k(512, 56) == 3  # ceil(1056 / 512)
    assert md.split_k(1, 56) == 56 // md.MIN_SPLIT_TILES  # capped by slices of at least 4 tiles
    assert md.split_k(1, 3) == 1  # too short to split
    assert md.split_k(32, 224, max_slices=5) == 5
    assert md.split_k(32, 224, max_slices=0) == 1  # a cap below one still runs one slice


def test_backend_refuses_an_unknown_moe_kernel(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from k2bench.engine.kernels.backend import BackendError
    from k2bench.engine.kernels.triton_backend import TritonBackend

    b = TritonBackend()
    assert b._moe_variant(torch.device("cpu")) == "dot_scaled"
    b.moe_variant = "dequant"  # deleted: slower than dot_scaled everywhere (moe_dispatch)
    with pytest.raises(BackendError, match="valid: fast, dot_scaled"):
        b._moe_variant(torch.device("cpu"))
