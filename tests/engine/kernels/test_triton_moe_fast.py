"""The fast-layout MoE (engine/kernels/triton_moe_fast.py): its E2M1 bit trick and word decode against the
OCP table, its load-time re-layout, and the kernels under TRITON_INTERPRET=1 against an independent float64
reference.

The reference and tolerance are those of test_triton_moe.py (dequantised weights, a loop over each
token's k experts in float64 with the documented activation rounding; float32 summation order, the
bf16 output cast, and W4's near-midpoint h roundings). The kernels run in a child process because
the interpreter must be on before triton compiles anything.
"""

from __future__ import annotations

import warnings

import pytest
import torch

# the interpreted kernel run behind the module fixture may take minutes on a loaded 2-core machine
pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

pytest.importorskip("triton")

from kernel_cases import run_interpreted  # noqa: E402  (this folder; after the importorskip)

from k2bench.engine.kernels.moe_fast_layout import (  # noqa: E402  (after the importorskip)
    MAX_SCALE_CODE,
    NanScaleError,
    ScaleRangeError,
    relayout_experts,
)
from k2bench.engine.model.mxfp4 import FP4_VALUES, dequantize_mxfp4, quantize_mxfp4  # noqa: E402

OCP = torch.tensor(FP4_VALUES, dtype=torch.float64)


def ocp_value(codes: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """OCP MX: E2M1 value times 2^(e - 127), in float64."""
    return OCP[codes.long()] * torch.exp2(e.double() - 127)


def test_bf16_bit_trick_matches_ocp_table_exhaustively():
    """Every E2M1 code at every scale the layout accepts: bf16 bits (sign << 15) | (magnitude << 6) times
    bf16 2^(e-1) equal the OCP value exactly, subnormal codes (0, 0.5) and signed zeros included."""
    code = torch.arange(16, dtype=torch.int32).repeat_interleave(MAX_SCALE_CODE + 1)
    e = torch.arange(MAX_SCALE_CODE + 1, dtype=torch.int32).repeat(16)
    scale = (((e + 126) << 7).to(torch.int16)).view(torch.bfloat16)
    bits = ((code & 7) << 6) | ((code & 8) << 12)
    got = bits.to(torch.int16).view(torch.bfloat16) * scale  # int16 wraps 0x8000 to the sign bit
    assert torch.equal(got.double(), ocp_value(code, e))
    assert torch.equal(torch.signbit(got), code >= 8)  # -0.0 stays negative zero


def test_word_packing_decodes_to_the_checkpoint_values():
    """The word layout, decoded in torch by the four shift / mask / multiply programs the kernels use
    (pair j of word 2q + h is k = 32h + 16(j // 2) + 8(j % 2) + 2q + lane), gives the checkpoint's
    values; scale group g of chunk c is the checkpoint's group 2c + g; K = 96 pads with zeros."""
    g = torch.Generator().manual_seed(2)
    E, L, H = 2, 32, 96
    w13, s13 = quantize_mxfp4(torch.randn(E, 2 * L, H, generator=g))
    w2, s2 = quantize_mxfp4(torch.randn(E, H, L, generator=g))
    words = relayout_experts(w13, s13, w2, s2)
    assert (words.hidden, words.inter) == (H, L)
    mask = 0x81C081C0
    programs = (lambda w: (w << 6) & mask, lambda w: ((w & 0x40384038) * 18) & mask, lambda w: w & mask,
                lambda w: (((w >> 10) & 0x000F000F) * 0x8020) & mask)
    for wf, sf, w, s in ((words.w13, words.s13, w13, s13), (words.w2, words.s2, w2, s2)):
        E, chunks, N, _ = wf.shape
        assert wf.is_contiguous() and wf.shape == (E, chunks, N, 32) and sf.shape == (E, chunks, N, 2)
        word = wf.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # [E, chunks, N, 8]
        vals = torch.zeros(E, chunks, N, 2, 2, 2, 4, 2, dtype=torch.float64)  # [.., h, s, c, q, lane]
        for j, prog in enumerate(programs):
            bits = prog(word).view(E, chunks, N, 4, 2)  # [.., q, h]
            for lane in range(2):
                b = ((bits >> (16 * lane)) & 0xFFFF).to(torch.int32)
                v = (b << 16).view(torch.float32).double() * 2.0**126  # bf16 bits as value * 2^-126
                vals[:, :, :, :, j // 2, j % 2, :, lane] = v.permute(0, 1, 2, 4, 3)
        vals = vals.reshape(E, chunks, N, 2, 32) * torch.exp2(sf.double() - 127)[..., None]
        vals = vals.reshape(E, chunks, N, 64).permute(0, 2, 1, 3).reshape(E, N, chunks * 64)
        k = 2 * w.shape[2]
        assert torch.equal(vals[..., :k], dequantize_mxfp4(w, s).double())
        assert not vals[..., k:].any()


def test_relayout_refuses_scales_it_cannot_hold():
    w, s = torch.zeros(1, 4, 32, dtype=torch.uint8), torch.full((1, 4, 2), 127, dtype=torch.uint8)
    relayout_experts(w, s, w, s)
    s[0, 1, 1] = MAX_SCALE_CODE + 1
    with pytest.raises(ScaleRangeError, match="above"):
        relayout_experts(w, s, w, s)
    s[0, 1, 1] = 0xFF
    with pytest.raises(NanScaleError, match="0xFF"):
        relayout_experts(w, s, w, s)


CHILD = r"""
import json, torch
from k2bench.engine.kernels.triton_backend import TritonBackend
from k2bench.engine.kernels.triton_moe import fused_moe_mxfp4
from k2bench.engine.kernels.moe_dispatch import FastTiles
from k2bench.engine.kernels.moe_fast_layout import relayout_experts
from k2bench.engine.kernels.triton_moe_fast import fused_moe_fast
from k2bench.engine.kernels.backend import BackendError
from moe_reference import make, reference, routing
from word_decode import word_decode_check

torch.set_num_threads(1)
decode_ok = word_decode_check("cpu", True)

configs = {"auto": None,
           "bn32": FastTiles(16, 32, 4, 3, prefetch=False),
           "bn32_prefetch": FastTiles(16, 32, 4, 3, prefetch=True),
           "bm32": FastTiles(32, 64, 4, 3, prefetch=False),
           "bm32_prefetch": FastTiles(32, 64, 4, 3, prefetch=True),
           "chunks2": FastTiles(16, 32, 4, 3, prefetch=True, chunks=2),
           "down_chunks2": FastTiles(16, 64, 4, 3, prefetch=False, down_chunks=2)}
cases = []
chunk_steps = []
# (E, H, L, k, T, skew, splits): H=96 / L=32 pad to whole 64-chunks; 20 pairs on one expert span blocks
shapes = [(12, 128, 64, 3, 3, None, (1, None)), (12, 256, 128, 3, 12, None, (1, None)),
          (8, 96, 32, 2, 20, 3, (1, None)), (10, 256, 192, 3, 4, None, (3, 2)), (10, 256, 192, 3, 4, None, (1, 2)),
          (10, 256, 192, 3, 4, None, (2, 1))]  # (1, 2) / (2, 1): one GEMM split, the other whole
for si, (E, H, L, k, T, skew, (sp1, sp2)) in enumerate(shapes):
    g, w, d13, d2 = make(si, E, H, L)
    fast = relayout_experts(*w)
    allowed = torch.tensor([e for e in range(E) if e not in (0, E - 2)])
    x = torch.randn(T, H, generator=g) * 2
    ids, wts = routing(g, T, k, allowed, skew)
    for ci, (dtype, a4w4) in enumerate([(torch.float32, False), (torch.float32, True), (torch.bfloat16, False),
                                        (torch.bfloat16, True)]):
        xd = x.to(dtype)
        ref, flip = reference(xd, ids, wts, d13, d2, a4w4)
        # configs rotate over shapes and numerics (each runs four times), to keep the interpreter quick
        name, cfg = list(configs.items())[(ci + si) % len(configs)]
        got = fused_moe_fast(xd, ids, wts, fast, a4w4=a4w4, config=cfg, split_k=sp1, down_split_k=sp2)
        err = (got.double() - ref).abs()
        tol = 1e-5 * ref.abs().max() + flip
        if dtype == torch.bfloat16:
            tol = tol + 2.0**-8 * ref.abs()
        cases.append({"case": [E, H, L, k, T, sp1, sp2, str(dtype), a4w4, name],
                      "dtype_ok": got.dtype == dtype and list(got.shape) == [T, H],
                      "worst": float((err / tol).max()), "scale": float(ref.abs().max())})
    if si in (2, 3):  # K padded past the last step (H=96, L=32), and K slices that the same chunks fill
        # whichever the step (2 chunks: 256 -> 128 + 128, 192 -> 128 + 64); several chunks a step = one
        one = fused_moe_fast(x, ids, wts, fast, config=configs["bn32_prefetch"], split_k=sp1, down_split_k=sp2)
        for pf in (False, True):
            cfg = FastTiles(16, 32, 4, 3, prefetch=pf, chunks=2)
            many = fused_moe_fast(x, ids, wts, fast, config=cfg, split_k=sp1, down_split_k=sp2)
            chunk_steps.append({"case": [E, H, L, sp1, sp2, pf], "equal": bool(torch.equal(many, one))})

# the backend: "fast" against the checkpoint-layout kernel; scales too large for the layout fall back
backend = []
g, w, d13, d2 = make(99, 12, 128, 64)
x = torch.randn(5, 128, generator=g)
ids, wts = routing(g, 5, 3, torch.arange(1, 11))
b = TritonBackend()
b.moe_variant = "fast"
b.prepare_moe(*w)
want = fused_moe_mxfp4(x, ids, wts, *w, a4w4=True)
got = b.fused_moe(x, ids, wts, *w, a4w4=True)
backend.append({"what": "fast", "rel": float((got - want).abs().max() / want.abs().max()), "cached": len(b._fast)})
big = [t.clone() for t in w]
big[1][0, 0, 0] = 130  # one block of expert 0 scaled by 2^3: outside the layout
b.prepare_moe(*big)
got = b.fused_moe(x, ids, wts, *big, a4w4=True)
want = fused_moe_mxfp4(x, ids, wts, *big, a4w4=True)
backend.append({"what": "fallback", "rel": float((got - want).abs().max() / want.abs().max()), "cached": len(b._fast)})
nan = [t.clone() for t in w]
nan[3][2, 5, 1] = 255
try:
    b.prepare_moe(*nan)
    refused = ""
except BackendError as exc:
    refused = str(exc)
print("RESULT" + json.dumps({"decode_ok": decode_ok, "cases": cases, "chunk_steps": chunk_steps, "backend": backend,
                            "refused": refused}))
"""


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(CHILD)


def test_kernel_decode_matches_ocp_table(interpreted):
    assert interpreted["decode_ok"]


def test_fast_moe_matches_float64_reference(interpreted):
    cases = interpreted["cases"]
    assert len(cases) == 6 * 4
    assert {c["case"][-1] for c in cases} == {"auto", "bn32", "bn32_prefetch", "bm32", "bm32_prefetch", "chunks2",
                                              "down_chunks2"}
    for c in cases:
        assert c["dtype_ok"], c
        assert c["worst"] <= 1.0, c
        assert c["scale"] > 0.1, c  # the outputs are not trivially zero


def test_several_chunks_a_step_give_the_one_chunk_sums(interpreted):
    """Two 64-wide chunks per K step (one copy each for words and scales) add the same terms in the same
    order as one chunk a step, also where a step reaches past K or past its K slice, with and without the
    activation prefetch. (Where the step changes how K is sliced, the float32 partials are added in
    another order, as with any other split.)"""
    steps = interpreted["chunk_steps"]
    assert len(steps) == 4 and {tuple(c["case"][:5]) for c in steps} == {(8, 96, 32, 1, None), (10, 256, 192, 3, 2)}
    assert all(c["equal"] for c in steps), steps


def test_backend_fast_variant_and_fallback(interpreted):
    fast, fallback = interpreted["backend"]
    assert fast["rel"] < 1e-5 and fast["cached"] == 1
    assert fallback["rel"] < 1e-6 and fallback["cached"] == 2  # the refused layout is remembered as None
    assert "0xFF" in interpreted["refused"]


@pytest.mark.gpu
@pytest.mark.parametrize("config", ["auto", "split", "no_prefetch", "warps8", "rows256", "prefill", "chunks2"])
def test_fast_moe_on_cuda_without_host_sync(config):
    """On a GPU: the PTX word decode against the OCP table, real-width H against float64, no host sync,
    and a CUDA-graph replay equal to the eager call."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import torch.nn.functional as F
    from word_decode import word_decode_check

    from k2bench.engine.kernels.moe_dispatch import FastTiles
    from k2bench.engine.kernels.triton_moe_fast import fused_moe_fast

    assert word_decode_check("cuda", False)
    E, H, L, k, T = 16, 7168, 512, 8, 5
    g = torch.Generator().manual_seed(0)
    w13, s13 = quantize_mxfp4(torch.randn(E, 2 * L, H, generator=g) * 0.02)
    w2, s2 = quantize_mxfp4(torch.randn(E, H, L, generator=g) * 0.02)
    x = torch.randn(T, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    wts = torch.rand(T, k, generator=g)
    d13, d2 = dequantize_mxfp4(w13, s13).double(), dequantize_mxfp4(w2, s2).double()
    ref = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        for j in range(k):
            e = int(ids[t, j])
            h = d13[e] @ x[t].to(torch.bfloat16).double()
            h = (F.silu(h[:L]) * h[L:]).to(torch.bfloat16).double()
            ref[t] += float(wts[t, j]) * (d2[e] @ h)
    fast = relayout_experts(w13.cuda(), s13.cuda(), w2.cuda(), s2.cuda())
    dev = [t.cuda() for t in (x, ids, wts)]
    kw = {"auto": {}, "split": {"split_k": 4, "down_split_k": 2},
          "no_prefetch": {"config": FastTiles(16, 128, 4, 3, prefetch=False)},
          "warps8": {"config": FastTiles(16, 128, 8, 4, prefetch=True), "split_k": 2},
          "rows256": {"config": FastTiles(16, 256, 4, 3, prefetch=True), "down_split_k": 2},
          "prefill": {"config": FastTiles(64, 128, 8, 4, prefetch=False)},
          "chunks2": {"config": FastTiles(16, 128, 4, 3, prefetch=True, chunks=2), "split_k": 4,
                      "down_split_k": 2}}[config]
    fused_moe_fast(*dev, fast, **kw)  # compile outside the sync check
    torch.cuda.synchronize()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode("error")
        got = fused_moe_fast(*dev, fast, **kw)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert float((got.double().cpu() - ref).abs().max() / ref.abs().max()) < 1e-3
    static = [t.clone() for t in dev]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe_fast(*static, fast, **kw)
    static[0].copy_(dev[0] * 0.5)
    static[1].copy_(torch.roll(dev[1], 1, dims=0))
    graph.replay()
    eager = fused_moe_fast(dev[0] * 0.5, torch.roll(dev[1], 1, dims=0), dev[2], fast, **kw)
    assert torch.allclose(out, eager, rtol=1e-5, atol=1e-5 * float(eager.abs().max()))
