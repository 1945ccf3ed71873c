"""A dense MLP held once: on the triton backend's fast variant `prepare_dense` builds the one-expert fast
copy at load and lets the checkpoint tensors go, so prefill-size batches must come from that copy alone.
Checked under TRITON_INTERPRET=1: `unrelayout` gives back the checkpoint bytes exactly (every scale code the
layout takes, K padded to whole chunks or not); a linear through it equals `dequant_linear` on the checkpoint
tensors bit for bit, and so does the whole released MLP against the path the kept tensors take on Hopper
(dequant_linear, swiglu, dequant_linear); decode batches give what they gave before the release; scales the
layout cannot take release nothing."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

pytest.importorskip("triton")

from kernel_cases import run_interpreted  # noqa: E402  (this folder; after the importorskip)

CHILD = r"""
import json, torch
from k2bench.engine.kernels.backend import BackendError
from k2bench.engine.kernels.moe_fast_layout import MAX_SCALE_CODE, _relayout, unrelayout
from k2bench.engine.kernels.torch_backend import TorchBackend
from k2bench.engine.kernels.triton_backend import DEQUANT_MIN_M, TritonBackend, dequant_linear
from moe_reference import make

torch.set_num_threads(1)
g = torch.Generator().manual_seed(3)
out = {"roundtrip": [], "linear": [], "mlp": [], "decode": []}
for N, K in [(70, 96), (3, 224), (130, 64)]:  # K = 96, 224: the last chunk is half padding
    w = torch.randint(0, 256, (1, N, K // 2), dtype=torch.uint8, generator=g)
    s = torch.randint(0, MAX_SCALE_CODE + 1, (1, N, K // 32), dtype=torch.uint8, generator=g)
    s[0, 0, 0], s[0, -1, -1] = 0, MAX_SCALE_CODE  # both ends of the range the layout takes
    wf, sf = _relayout(w, s)
    w_back, s_back = unrelayout(wf[0], sf[0], K)
    out["roundtrip"].append(bool(torch.equal(w_back, w[0]) and torch.equal(s_back, s[0])))
    x = torch.randn(5, K, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        for a4w4 in (False, True):
            want = dequant_linear(x.to(dtype), w[0], s[0], a4w4=a4w4)
            got = dequant_linear(x.to(dtype), w_back, s_back, a4w4=a4w4)
            out["linear"].append(bool(torch.equal(got, want)) and bool(torch.isfinite(want).all()))


def release(b, weights):
    kept = [t.clone() for t in weights]
    ok = b.prepare_dense(*kept)
    if ok:
        for t in kept:
            t.data = torch.empty(0, dtype=t.dtype)
    return ok, kept


H, L = 128, 96  # L = 96: the down projection's K is padded to two chunks
_, w, _, _ = make(11, 1, H, L)
w = [t[0] for t in w]
b = TritonBackend()
b.moe_variant = "fast"
ok, empty = release(b, w)
out["released"] = ok and all(t.numel() == 0 for t in empty)
kept_b = TritonBackend()
kept_b.moe_variant = "fast"
for dtype in (torch.float32, torch.bfloat16):
    x = (torch.randn(DEQUANT_MIN_M, H, generator=g) * 2).to(dtype)
    for a4w4 in (False, True):
        got = b.dense_mlp(x, *empty, a4w4=a4w4)
        # what the kept tensors run on a GPU without FP4 units (TritonBackend.linear's dequant_linear branch)
        h = b.swiglu(dequant_linear(x, w[0], w[1], a4w4=a4w4), a4w4)
        want = dequant_linear(h, w[2], w[3], a4w4=a4w4, x_quantized=a4w4)
        out["mlp"].append({"case": [str(dtype), a4w4], "equal": bool(torch.equal(got, want)),
                           "shape_dtype": list(got.shape) == [DEQUANT_MIN_M, H] and got.dtype == dtype})
        xs = x[:3]  # a decode batch: the one-expert fast MoE, as before the release
        out["decode"].append(bool(torch.equal(b.dense_mlp(xs, *empty, a4w4=a4w4),
                                              kept_b.dense_mlp(xs, *w, a4w4=a4w4))))
out["empty_batch"] = list(b.dense_mlp(torch.zeros(0, H), *empty, a4w4=True).shape)
big = [t.clone() for t in w]
big[1][0, 0] = MAX_SCALE_CODE + 1  # 2^2: beyond the layout's bf16 decode
bb = TritonBackend()
bb.moe_variant = "fast"
ok_big, kept_big = release(bb, big)
out["big_scale"] = {"released": ok_big, "kept": all(t.numel() > 0 for t in kept_big)}
nan = [t.clone() for t in w]
nan[3][0, 0] = 255
nb = TritonBackend()
nb.moe_variant = "fast"
try:
    nb.prepare_dense(*nan)
    out["nan"] = ""
except BackendError as exc:
    out["nan"] = str(exc)
other = TritonBackend()
other.moe_variant = "dot_scaled"
out["others_keep"] = [TorchBackend().prepare_dense(*w), other.prepare_dense(*w)]
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(CHILD)


def test_unrelayout_gives_back_the_checkpoint_bytes(interpreted):
    assert interpreted["roundtrip"] == [True] * 3


def test_linear_through_the_fast_copy_equals_dequant_linear(interpreted):
    assert interpreted["linear"] == [True] * 12


def test_released_mlp_prefill_is_the_dequantised_path_bit_for_bit(interpreted):
    assert interpreted["released"]
    assert len(interpreted["mlp"]) == 4
    for case in interpreted["mlp"]:
        assert case["equal"] and case["shape_dtype"], case


def test_released_mlp_decode_unchanged(interpreted):
    assert interpreted["decode"] == [True] * 4
    assert interpreted["empty_batch"] == [0, 128]


def test_scales_outside_the_layout_release_nothing(interpreted):
    assert interpreted["big_scale"] == {"released": False, "kept": True}
    assert "NaN" in interpreted["nan"]
    assert interpreted["others_keep"] == [False, False]


@pytest.mark.gpu
@pytest.mark.parametrize("inter", [2048, 18432])  # a Kimi-K2.5 shared expert, its dense layer-0 MLP
def test_released_mlp_at_kimi_width_on_cuda(inter):
    """On a GPU at H=7168 (compiled kernels): the released MLP's prefill equals dequant_linear on the checkpoint
    tensors bit for bit, and its decode equals the kept MLP's."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from k2bench.engine.kernels.triton_backend import DEQUANT_MIN_M, TritonBackend, dequant_linear

    H = 7168
    g = torch.Generator("cuda").manual_seed(inter)
    w = [torch.randint(0, 256, (2 * inter, H // 2), dtype=torch.uint8, device="cuda", generator=g),
         torch.randint(118, 122, (2 * inter, H // 32), dtype=torch.uint8, device="cuda", generator=g),
         torch.randint(0, 256, (H, inter // 2), dtype=torch.uint8, device="cuda", generator=g),
         torch.randint(118, 122, (H, inter // 32), dtype=torch.uint8, device="cuda", generator=g)]
    b, kept_b = TritonBackend("cuda"), TritonBackend("cuda")
    empty = [t.clone() for t in w]
    assert b.prepare_dense(*empty)
    for t in empty:
        t.data = torch.empty(0, dtype=t.dtype, device=t.device)
    x = torch.randn(DEQUANT_MIN_M, H, dtype=torch.bfloat16, device="cuda", generator=g)
    want = dequant_linear(b.swiglu(dequant_linear(x, w[0], w[1], a4w4=True), True), w[2], w[3], a4w4=True,
                          x_quantized=True)
    assert torch.equal(b.dense_mlp(x, *empty, a4w4=True), want)
    for rows in (4, 128):
        assert torch.equal(b.dense_mlp(x[:rows], *empty, a4w4=True), kept_b.dense_mlp(x[:rows], *w, a4w4=True))
