"""DeepSeek-V3 / Kimi-K2 expert selection in one Triton kernel (the routing glue of the MoE).

The torch form (model/moe.py's reference, `TorchBackend.route_experts`) is about a dozen kernels per
layer: bias add, group scores by a top-2, group top-k, mask, top-k, gather, sum, divide, scale. Here
one program takes a few tokens' sigmoid scores [E] and does all of it in registers:
choice = score + correction bias (selection only); with n_group > 1 each group's score is the sum of
its two best choices and only the topk_group best groups stay eligible; the k best eligible experts
are taken one at a time (highest first, the lowest index on a tie), their weights are the plain
scores, renormalised to sum 1 if asked, times the routed scaling factor.

The scores come in from torch (`sigmoid` there), so they are bit-equal to the reference's and only a
tie between two choices can pick differently (torch.topk breaks ties in no documented order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS = 4  # tokens per program


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
