"""DeepSeek-V3 / Kimi-K2 expert selection in one Triton kernel (the routing glue of the MoE).

The torch form (model/moe.py's reference, `TorchBackend.route_experts`) is about a dozen kernels per
layer: bias add, group scores by a top-2, group top-k, mask, top-k, gather, sum, divide, scale. Here
one program takes a few tokens' sigmoid scores [E] and does all of it in registers:
choice = score + correction bias (selection only); with n_group > 1 each group's score is the sum of
its two best choices and only the topk_group best groups stay eligible; the k best eligible experts
are taken one at a time (highest first, the lowest index on a tie), their weights are the plain
scores, renormalised to sum 1 if asked, times the routed scaling factor.

At decode sizes the scores come from `router_scores`, one more kernel: sigmoid(x . W^T) in float32. torch
runs that product as a float32 GEMM that cuBLAS gives a dozen thread blocks (384 experts in 32-wide
tiles, K = 7168 unsplit), about 22 us on an H200 at 4 and at 128 tokens for 11 MB of router weights (one
replicated router per MoE layer on every rank: 60 of them at full depth); the kernel spreads the experts
over a hundred programs. Its float32 sums run in another order than cuBLAS's, so scores differ from the
reference's in the last bits and a near-tie between two choices can pick differently. Past
ROUTER_KERNEL_MAX_T tokens (prefill) the GEMM is compute-bound and torch keeps it; there the scores are
bit-equal to the reference's and only a tie picks differently (torch.topk breaks ties in no documented
order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS = 4  # tokens per program
ROUTER_EXPERTS = 4  # experts per router_scores program: 96 programs for 384 experts
ROUTER_KERNEL_MAX_T = 128  # tokens up to which router_scores runs its kernel (above: torch's GEMM)


@triton.jit(do_not_specialize=["T"])
def _router_scores(x_ptr, w_ptr, out_ptr, T, E, K, s_xt, s_we, s_ot, BT: tl.constexpr, BE: tl.constexpr,
                   BK: tl.constexpr):
    """out[t, e] = sigmoid(sum_k x[t, k] * w[e, k]) in float32 for BT tokens and BE experts: products of
    [BT, BE, BK] tiles summed over k in registers, one fixed order (no atomics)."""
    t = tl.program_id(1) * BT + tl.arange(0, BT)
    e = tl.program_id(0) * BE + tl.arange(0, BE)
    t_ok = t < T
    e_ok = e < E
    acc = tl.zeros((BT, BE), tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        k_ok = k < K
        xk = tl.load(x_ptr + t[:, None].to(tl.int64) * s_xt + k[None, :], mask=t_ok[:, None] & k_ok[None, :],
                     other=0.0).to(tl.float32)
        wk = tl.load(w_ptr + e[:, None].to(tl.int64) * s_we + k[None, :], mask=e_ok[:, None] & k_ok[None, :],
                     other=0.0).to(tl.float32)
        acc += tl.sum(xk[:, None, :] * wk[None, :, :], axis=2)
    out = out_ptr + t[:, None].to(tl.int64) * s_ot + e[None, :]
    tl.store(out, tl.sigmoid(acc), mask=t_ok[:, None] & e_ok[None, :])


def router_scores(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """sigmoid(x . weight^T) in float32 [T, E] for x [T, H] (any float dtype) and the float32 router
    weight [E, H]; torch's GEMM past ROUTER_KERNEL_MAX_T tokens."""
    T, H = x.shape
    E = weight.shape[0]
    if weight.shape[1] != H:
        raise ValueError(f"router: x [T, {H}] against a weight of {tuple(weight.shape)}")
    if T > ROUTER_KERNEL_MAX_T:
        return torch.nn.functional.linear(x.float(), weight.float()).sigmoid()
    x = x.contiguous()
    weight = weight.contiguous()
    out = torch.empty(T, E, dtype=torch.float32, device=x.device)
    if T:
        bt = min(16, triton.next_power_of_2(T))
        bk = max(32, 4096 // (bt * ROUTER_EXPERTS))  # a [bt, 4, bk] product tile: 32 values a thread
        _router_scores[(triton.cdiv(E, ROUTER_EXPERTS), triton.cdiv(T, bt))](
            x, weight, out, T, E, H, x.stride(0), weight.stride(0), out.stride(0), BT=bt, BE=ROUTER_EXPERTS, BK=bk,
            num_warps=4)
    return out


@triton.jit(do_not_specialize=["T"])  # a token count: one compiled kernel for every batch
def _route(
    scores_ptr, bias_ptr, w_ptr, ids_ptr, T, s_st, scale,
    E: tl.constexpr, TOPK: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, RENORM: tl.constexpr,
    ROWS: tl.constexpr, BE: tl.constexpr, BG: tl.constexpr, BK: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    r_ok = rows < T
    e = tl.arange(0, BE)
    e_ok = e < E
    ok = r_ok[:, None] & e_ok[None, :]
    s = tl.load(scores_ptr + rows[:, None].to(tl.int64) * s_st + e[None, :], mask=ok, other=0.0)
    b = tl.load(bias_ptr + e, mask=e_ok, other=0.0)
    choice = tl.where(ok, s + b[None, :], float("-inf"))
    if N_GROUP > 1:
        size = E // N_GROUP
        group = e // size
        gi = tl.arange(0, BG)
        gscore = tl.full((ROWS, BG), float("-inf"), tl.float32)
        for g in tl.static_range(N_GROUP):
            inside = (group == g)[None, :] & ok
            c = tl.where(inside, choice, float("-inf"))
            best = tl.max(c, axis=1)
            at = tl.min(tl.where(c == best[:, None], e[None, :], BE), axis=1)
            top2 = best
            if size > 1:
                top2 = best + tl.max(tl.where(e[None, :] == at[:, None], float("-inf"), c), axis=1)
            gscore = tl.where(gi[None, :] == g, top2[:, None], gscore)
        keep = tl.zeros((ROWS, BE), tl.int1)
        for _ in tl.static_range(TOPK_GROUP):
            best = tl.max(gscore, axis=1)
            at = tl.min(tl.where(gscore == best[:, None], gi[None, :], BG), axis=1)
            keep = keep | (group[None, :] == at[:, None])
            gscore = tl.where(gi[None, :] == at[:, None], float("-inf"), gscore)
        choice = tl.where(keep, choice, float("-inf"))
    k = tl.arange(0, BK)
    ids = tl.zeros((ROWS, BK), tl.int32)
    wts = tl.zeros((ROWS, BK), tl.float32)
    for j in tl.static_range(TOPK):
        best = tl.max(choice, axis=1)
        at = tl.min(tl.where(choice == best[:, None], e[None, :], BE), axis=1)
        hit = e[None, :] == at[:, None]
        w = tl.sum(tl.where(hit, s, 0.0), axis=1)
        ids = tl.where(k[None, :] == j, at[:, None], ids)
        wts = tl.where(k[None, :] == j, w[:, None], wts)
        choice = tl.where(hit, float("-inf"), choice)
    if RENORM:
        wts = wts / (tl.sum(wts, axis=1)[:, None] + 1e-20)
    out = rows[:, None].to(tl.int64) * TOPK + k[None, :]
    out_ok = r_ok[:, None] & (k < TOPK)[None, :]
    tl.store(w_ptr + out, wts * scale, mask=out_ok)
    tl.store(ids_ptr + out, ids.to(tl.int64), mask=out_ok)


def route_experts(
    scores: torch.Tensor, bias: torch.Tensor, *, top_k: int, n_group: int, topk_group: int,
    renormalize: bool, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, k], ids int64 [T, k]) from sigmoid scores float32 [T, E] and the bias [E]."""
    T, E = scores.shape
    if E % n_group or not 1 <= topk_group <= n_group or not 1 <= top_k <= E:
        raise ValueError(f"routing: E={E}, n_group={n_group}, topk_group={topk_group}, top_k={top_k} do not fit")
    scores = scores.float().contiguous()
    w = torch.empty(T, top_k, dtype=torch.float32, device=scores.device)
    ids = torch.empty(T, top_k, dtype=torch.int64, device=scores.device)
    if T:
        _route[(triton.cdiv(T, ROWS),)](
            scores, bias.float().contiguous(), w, ids, T, scores.stride(0), float(scale),
            E=E, TOPK=top_k, N_GROUP=n_group, TOPK_GROUP=topk_group, RENORM=renormalize, ROWS=ROWS,
            BE=triton.next_power_of_2(E), BG=triton.next_power_of_2(max(2, n_group)),
            BK=triton.next_power_of_2(top_k),
        )
    return w, ids
