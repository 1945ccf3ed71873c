"""The MoE glue kernels (engine/kernels/triton_moe_glue.py) against torch references, under TRITON_INTERPRET=1.

- alignment: equal, slot for slot, to the torch sort / searchsorted / cumsum / scatter chain it replaced
  (written out here as the reference), and the layout rules checked directly (every pair once, padding
  only at the end of an expert's last block, blocks in expert order), over one and several chunks;
- bridge: without the activation, bit-equal to torch's bf16 cast and MXFP4 quantiser; with it, silu(gate) *
  up of the summed slices against torch in float32 (tl.sigmoid may differ in the last bit, so a rare element
  may round the other way, by at most one step of its grid);
- combine: bit-equal to the documented order (slices, then experts, in float32; one cast; `out + add` as
  torch rounds it) for bf16, float16 and float32 outputs.
The gpu test runs the same checks on the compiled kernels.
"""

from __future__ import annotations

import pytest
from kernel_cases import cuda_cases, interpreted_cases  # this folder

pytestmark = pytest.mark.engine

CASES = r'''
import torch
import torch.nn.functional as F
from k2bench.engine.kernels.triton_moe_glue import moe_align, moe_align_sizes, moe_bridge, moe_combine
from k2bench.engine.model.mxfp4 import fake_quantize_mxfp4


def align_reference(topk_ids, num_experts, block_m):
    """The torch chain moe_align used before (stable sort by expert, groups padded to block_m)."""
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    pairs = flat.numel()
    padded_len, num_blocks = moe_align_sizes(pairs, num_experts, block_m)
    sorted_ids, order = torch.sort(flat, stable=True)
    starts = torch.searchsorted(sorted_ids, torch.arange(num_experts + 1, device=dev))
    counts = starts[1:] - starts[:-1]
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    dest = (padded_end - padded)[sorted_ids] + torch.arange(pairs, device=dev) - starts[sorted_ids]
    sorted_pairs = torch.full((padded_len,), pairs, dtype=torch.int32, device=dev)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    owner = torch.searchsorted(padded_end, torch.arange(num_blocks, device=dev) * block_m, right=True)
    return sorted_pairs, torch.where(owner < num_experts, owner, -1).to(torch.int32)


def layout_ok(al, ids, num_experts, block_m):
    """The layout rules, checked without the reference."""
    pairs = ids.numel()
    sp = al.sorted_pairs.long().cpu()
    be = al.block_experts.long().cpu()
    flat = ids.reshape(-1).cpu()
    real = sp[sp != pairs]
    ok = torch.equal(torch.sort(real).values, torch.arange(pairs))  # every pair exactly once
    used = int(((torch.bincount(flat, minlength=num_experts) + block_m - 1) // block_m).sum())
    ok &= bool((be[:used] >= 0).all()) and bool((be[used:] == -1).all()) and bool((be[1:used] >= be[:used - 1]).all())
    for b in range(be.numel()):
        blk = sp[b * block_m:(b + 1) * block_m]
        members = blk[blk != pairs]
        if be[b] < 0:
            ok &= members.numel() == 0
            continue
        ok &= members.numel() > 0 and bool((flat[members] == be[b]).all())
        ok &= bool((blk[:members.numel()] != pairs).all())  # padding only at the end
        ok &= bool((members[1:] > members[:-1]).all())  # pair order inside an expert (stable)
    return bool(ok)


def alignment(device):
    g = torch.Generator().manual_seed(3)
    res = []
    cases = [(1, 3, 12, 16), (3, 3, 12, 16), (12, 3, 12, 32), (5, 8, 12, 16), (1, 8, 384, 16), (4, 8, 384, 16),
             (40, 8, 384, 64), (100, 8, 37, 16), (70, 8, 8, 16)]  # the last three span several chunks of 256 pairs
    for T, k, E, bm in cases:
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
        ids[ids == 4] = 5  # expert 4 never used
        res.append([T, k, E, bm, ids])
    skew = torch.full((300, 2), 7)
    skew[:, 1] = torch.arange(300) % 3
    res.append([300, 2, 12, 16, skew])  # 300 pairs on expert 7: many blocks of one expert, over chunks
    res.append([4, 3, 12, 16, torch.arange(12).view(4, 3)])  # every pair its own expert: the worst padding
    out = []
    for T, k, E, bm, ids in res:
        ids = ids.to(device)
        al = moe_align(ids, E, bm)
        want_pairs, want_blocks = align_reference(ids, E, bm)
        out.append([T, k, E, bm, torch.equal(al.sorted_pairs, want_pairs), torch.equal(al.block_experts, want_blocks),
                    layout_ok(al, ids, E, bm), al.sentinel == ids.numel()])
    # sizes depend on (T, k, E, block_m) only, never on which experts were picked
    a = moe_align(torch.zeros(6, 4, dtype=torch.long, device=device), 16, 16)
    b = moe_align((torch.arange(24, device=device).view(6, 4) % 16), 16, 16)
    out.append(a.sorted_pairs.shape == b.sorted_pairs.shape and a.block_experts.shape == b.block_experts.shape)
    return out


def bridge(device, subnormal_casts):
    """subnormal_casts=False leaves out bf16 outputs below 2^-126: the interpreter's float32 -> bf16 cast
    mangles them (a defect of the interpreter, as in test_triton_quant; the gpu test checks them)."""
    g = torch.Generator().manual_seed(4)
    out = {}
    for slices, pairs, inter in [(1, 7, 64), (3, 40, 96)]:
        src = (torch.randn(slices, pairs, 2 * inter, generator=g) * 3).to(device)
        gate, up = src.sum(0).split(inter, dim=1)
        h = gate * torch.sigmoid(gate) * up
        for a4w4 in (False, True):
            want = fake_quantize_mxfp4(h).to(torch.bfloat16) if a4w4 else h.to(torch.bfloat16)
            got = moe_bridge(src, inter, act=True, a4w4=a4w4)
            diff = (got.float() - want.float()).abs()
            # a value that rounds the other way moves by one step of its grid: a bf16 ulp, or for MXFP4 at most
            # the block's largest step (2 x its scale, <= amax / 2)
            step = 2.0**-7 * want.float().abs() if not a4w4 else want.float().view(pairs, -1, 32).abs().amax(-1, keepdim=True).expand(-1, -1, 32).reshape(pairs, inter) / 2
            out[f"act {slices} {a4w4}"] = [got.dtype == torch.bfloat16, list(got.shape) == [pairs, inter],
                                            float((diff != 0).float().mean()) < 0.01, bool((diff <= step + 1e-30).all())]
        flat = (torch.randn(pairs, inter, generator=g) * 5).to(device)
        flat[0, :32] *= 1e-38  # subnormal-scale block
        keep = torch.ones_like(flat, dtype=torch.bool) if subnormal_casts else (flat.abs() >= 2.0**-126)
        out[f"plain {slices}"] = [torch.equal(moe_bridge(flat, inter, act=False, a4w4=True),
                                              fake_quantize_mxfp4(flat).to(torch.bfloat16)),
                                  torch.equal(moe_bridge(flat, inter, act=False, a4w4=False)[keep],
                                              flat.to(torch.bfloat16)[keep])]
    return out


def combine(device):
    g = torch.Generator().manual_seed(5)
    out = {}
    for slices, tokens, k, hidden in [(1, 3, 2, 40), (3, 5, 8, 1100)]:
        y = (torch.randn(slices, tokens * k, hidden, generator=g) * 4).to(device)
        acc = torch.zeros(tokens, hidden, device=device)
        for j in range(k):  # the documented order: slices of a pair, then the pairs of a token in order
            part = torch.zeros(tokens, hidden, device=device)
            for s in range(slices):
                part = part + y[s, j::k]
            acc = acc + part
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            add = (torch.randn(tokens, hidden, generator=g) * 2).to(dtype).to(device)
            got = moe_combine(y, k, dtype)
            got_add = moe_combine(y, k, dtype, add)
            out[f"{slices} {k} {dtype}"] = [torch.equal(got, acc.to(dtype)), torch.equal(got_add, acc.to(dtype) + add),
                                            bool(((got.double() - y.double().sum(0).view(tokens, k, hidden).sum(1)).abs()
                                                  <= 1e-5 * y.abs().max() + 2.0**-7 * got.double().abs()).all())]
    return out


def run(device, subnormal_casts=True):
    return {"align": alignment(device), "bridge": bridge(device, subnormal_casts), "combine": combine(device)}
'''


def _check(res: dict) -> None:
    *cases, same_sizes = res["align"]
    for row in cases:
        assert row[4:] == [True, True, True, True], row
    assert same_sizes
    assert res["bridge"] and all(v == [True] * len(v) for v in res["bridge"].values()), res["bridge"]
    assert res["combine"] and all(v == [True, True, True] for v in res["combine"].values()), res["combine"]


def test_glue_kernels_under_interpreter():
    _check(interpreted_cases(CASES, "run('cpu', subnormal_casts=False)"))


def test_align_rejects_bad_arguments():
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from k2bench.engine.kernels.triton_moe_glue import moe_align, moe_align_sizes

    with pytest.raises(ValueError, match="topk_ids"):
        moe_align(torch.zeros(4, dtype=torch.long), 8, 16)
    with pytest.raises(ValueError, match="power of two"):
        moe_align(torch.zeros(2, 2, dtype=torch.long), 8, 24)
    assert moe_align_sizes(24, 16, 16) == (272, 17)  # 24 + 16 * 15 = 264, rounded up to whole blocks
    assert moe_align_sizes(8, 384, 16) == (128, 8)  # decode: T=1, k=8 needs 8 blocks, not 384


@pytest.mark.gpu
def test_glue_kernels_on_cuda():
    _check(cuda_cases(CASES, "run"))
