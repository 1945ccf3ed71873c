"""For a GPU run: the triton backend's pieces at prefill sizes (hundreds to thousands of tokens), each
against the torch backend on the same device in float32.

A4W4's FP4 x FP4 products are exact, so in float32 only summation order separates the two backends;
the interpreter tests cover the logic on tiny shapes, these cover the compiled kernels where many
pairs share an expert (several BLOCK_M blocks per expert) and long causal prefills.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.engine, pytest.mark.gpu]


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@pytest.mark.parametrize("T", [512, 3000])
def test_fused_moe_many_pairs_per_expert(T):
    from k2bench.engine.kernels.torch_backend import TorchBackend
    from k2bench.engine.kernels.triton_moe import fused_moe_mxfp4
    from k2bench.engine.model.mxfp4 import quantize_mxfp4

    E, H, L, k = 64, 1024, 256, 8
    g = torch.Generator().manual_seed(T)
    w13, s13 = (t.cuda() for t in quantize_mxfp4(torch.randn(E, 2 * L, H, generator=g) * 0.05))
    w2, s2 = (t.cuda() for t in quantize_mxfp4(torch.randn(E, H, L, generator=g) * 0.05))
    x = torch.randn(T, H, generator=g).cuda()
    wts, ids = torch.randn(T, E, generator=g).cuda().softmax(-1).topk(k, dim=-1)
    ref = TorchBackend("cuda").fused_moe(x, ids, wts, w13, s13, w2, s2, a4w4=True)
    got = fused_moe_mxfp4(x, ids, wts, w13, s13, w2, s2, a4w4=True)
    assert _rel(got, ref) < 1e-5


@pytest.mark.parametrize("n, ctx", [(512, 512), (300, 1100), (200, 1100), (2048, 2048)])
def test_prefill_attention_long(n, ctx):
    from k2bench.engine.kernels.torch_backend import TorchBackend
    from k2bench.engine.kernels.triton_backend import prefill_attention
    from k2bench.engine.model.attn_meta import AttentionMetadata

    H, nope, rope, r, v, bs = 16, 128, 64, 512, 128, 16
    g = torch.Generator().manual_seed(n + ctx)
    nblk = -(-ctx // bs)
    table = (torch.randperm(nblk + 5, generator=g)[:nblk]).view(1, nblk)
    cache = torch.randn(nblk + 5, bs, r + rope, generator=g).cuda()
    q_nope = torch.randn(n, H, nope, generator=g).cuda()
    q_pe = torch.randn(n, H, rope, generator=g).cuda()
    w_uk = (torch.randn(H, nope, r, generator=g) / r**0.5).cuda()
    w_uv = (torch.randn(H, v, r, generator=g) / r**0.5).cuda()
    meta = AttentionMetadata(cu_seqlens_q=torch.tensor([0, n]).cuda(), context_lens=torch.tensor([ctx]).cuda(),
                             slot_mapping=torch.zeros(n, dtype=torch.long).cuda(), block_tables=table.cuda(),
                             block_size=bs)
    be = TorchBackend("cuda")
    scale = (nope + rope) ** -0.5
    ref = be.mla(q_nope, q_pe, cache, be.plan_attention(meta, r + rope), scale, w_uk, w_uv)
    slots = (table[0].unsqueeze(1) * bs + torch.arange(bs)).reshape(-1)[:ctx].cuda()
    got = prefill_attention(q_nope, q_pe, cache.view(-1, r + rope)[slots], scale, w_uk, w_uv)
    assert _rel(got, ref) < 1e-4


@pytest.mark.parametrize("m", [512, 4096])
def test_mxfp4_gemm_prefill_sizes(m):
    from k2bench.engine.kernels.triton_backend import mxfp4_matmul
    from k2bench.engine.model.mxfp4 import dequantize_mxfp4, fake_quantize_mxfp4, quantize_mxfp4

    g = torch.Generator().manual_seed(m)
    n, k = 2048, 1024
    x = torch.randn(m, k, generator=g).cuda()
    wp, ws = (t.cuda() for t in quantize_mxfp4(torch.randn(n, k, generator=g)))
    wd = dequantize_mxfp4(wp, ws)
    assert _rel(mxfp4_matmul(x, wp, ws, a4w4=True), fake_quantize_mxfp4(x) @ wd.T) < 1e-5
    assert _rel(mxfp4_matmul(x, wp, ws, a4w4=False), x.to(torch.bfloat16).float() @ wd.T) < 1e-5


def test_prefill_attention_takes_a_fused_sdpa_kernel_in_bf16():
    """With the math kernel switched off the bf16 prefill still runs (a fused kernel accepts the 4-D,
    unpadded 192/128 shapes, causal upper-left and lower-right) and matches a float64 reference; the
    lower-right path also runs on the flash kernel alone."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from k2bench.engine.kernels.triton_backend import prefill_attention

    H, nope, rope, r, v = 16, 128, 64, 512, 128
    g = torch.Generator().manual_seed(3)
    # padded square calls (1000 rows as 1024; 300 queries after 800 cached tokens) and one lower-right call
    for n, ctx in [(1024, 1024), (1000, 1000), (300, 1100), (200, 1100)]:
        kv = torch.randn(ctx, r + rope, generator=g).cuda()
        q_nope = torch.randn(n, H, nope, generator=g).cuda()
        q_pe = torch.randn(n, H, rope, generator=g).cuda()
        w_uk = (torch.randn(H, nope, r, generator=g) / r**0.5).cuda()
        w_uv = (torch.randn(H, v, r, generator=g) / r**0.5).cuda()
        scale = (nope + rope) ** -0.5
        ref = prefill_attention(q_nope.double(), q_pe.double(), kv.double(), scale, w_uk.double(), w_uv.double())
        bf = [t.to(torch.bfloat16) for t in (q_nope, q_pe, kv)]
        fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
        with sdpa_kernel(fused):
            got = prefill_attention(*bf, scale, w_uk.to(torch.bfloat16), w_uv.to(torch.bfloat16))
        assert got.shape == (n, H, v)
        assert _rel(got, ref) < 2e-2, (n, ctx)
        if n < ctx:  # the lower-right mask on the flash kernel alone: values padded to the key width
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                flash = prefill_attention(*bf, scale, w_uk.to(torch.bfloat16), w_uv.to(torch.bfloat16),
                                          path="lower_right")
            assert _rel(flash, ref) < 2e-2, (n, ctx)


@pytest.mark.parametrize("m", [1, 1100])
def test_linear_dispatch_matches_the_kernel(m):
    """Below DEQUANT_MIN_M rows the backend runs `_mxfp4_gemm`, from it dequantise + cuBLAS: both give the
    same float32 result (bf16-rounded activations times exact weights, float32 sums)."""
    from k2bench.engine.kernels import get_backend
    from k2bench.engine.kernels.triton_backend import DEQUANT_MIN_M, mxfp4_matmul
    from k2bench.engine.model.mxfp4 import quantize_mxfp4

    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, 1024, generator=g).cuda()
    wp, ws = (t.cuda() for t in quantize_mxfp4(torch.randn(768, 1024, generator=g)))
    be = get_backend("triton", "cuda")
    for a4w4 in (False, True):
        got = be.linear(x, wp, ws, a4w4=a4w4)
        assert _rel(got, mxfp4_matmul(x, wp, ws, a4w4=a4w4, split_k=1)) < 1e-5, (m, a4w4)
    assert (m >= DEQUANT_MIN_M) == (m == 1100)
