"""MLA decode stage 1 for Hopper, written in Gluon (Triton's explicit-layout dialect).

Same contract as `triton_attention._mla_decode_split` (64 heads of one sequence per program over one
slice of its paged latent cache, online softmax in base 2, a direct or a partial output), for the case
that dominates decode time: bf16 / fp16 query and cache, 64 heads, latent 512 + rope 64, 8 warps.

Why a second kernel: compiled from `tl.dot`, the score product feeds the output product ("chained"
dots), and triton then lays all 8 warps along the 64 head rows. 64 rows fill one warpgroup, so both
warpgroups compute the same scores and each re-reads the 72 KiB query from shared memory for two
narrow (n32) instructions per k-step: about 96 shared-memory cycles per k-step against 32 of tensor
work. Its software pipeline also issues the next tile's copy after the output product and waits for it
at the top of the next iteration, so load and compute hardly overlap (bench/mla_decode_anatomy.py
times both effects). Here the layouts and the pipeline are written out:
- scores [64, BLOCK_N] on a [4, 2] warp grid: each warpgroup computes half of the tokens once;
- output [64, 512] float32 on a [4, 2] grid: each warpgroup accumulates 256 of the latent columns;
- NBUF shared buffers of [BLOCK_N, 512 + 64] filled by cp.async; the block table entries for a copy
  are loaded one iteration before it (their latency hides too).

The time goes to the loop's own work, not to HBM: on an H200 at 128 x 8k the kernel takes as long on
an L2-resident cache as on the real one (bench/engine_mla_bench.py's "L2-resident" rows). So each tile
passes fewer CTA-wide barriers (6 in the sm_90 SASS of the loop, where the first version had 12):
- the copy of tile t + NBUF - 1 is issued after the barrier that opens tile t (by then every warpgroup
  is done with tile t - 1, whose buffer it takes), under the score product, rather than behind a
  barrier of its own at the top of the iteration;
- the softmax denominators are kept per element ([64, BLOCK_N], 16 registers a thread) and summed over
  the tokens once after the loop, so the loop reduces across warpgroups only for the row maximum;
- the probabilities reach the output product as its A operand from an 8 KiB shared buffer that each
  warpgroup writes its half of (one barrier), not through a register layout conversion (four);
- the query is copied to shared memory by cp.async in the first tile's group, not loaded through
  registers and stored (a program starts on one wait).
Measured together at 128 x 8k: 0.374 ms against 0.441 for the first version (1.31x / 1.54x the byte
floor; bench/results/2026-12-01_h200_mla4). With PREFETCH the tile after the next copy is asked into
L2 (`prefetch.global.L2`) under the output product; it has been slower in every measurement (0.398
against 0.374 ms there, and bench/results/2026-12-01_h200_mla3), so it is off by default.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)


@gluon.jit
def _block_ids(tables_row, first, end, BLOCK_N: gl.constexpr, PAGE: gl.constexpr, layout: gl.constexpr):
    """Physical block of each token of the tile starting at `first` (0 past the slice's end)."""
    tok = first + gl.arange(0, BLOCK_N, layout)
    return gl.load(tables_row + tok // PAGE, mask=tok < end, other=0)


@gluon.jit
def _copy_tile(lat_buf, pe_buf, kv_ptr, blk_l, blk_p, first, end, s_kvb, s_kvt,
               R: gl.constexpr, P: gl.constexpr, PAGE: gl.constexpr, BLOCK_N: gl.constexpr,
               LAT_L: gl.constexpr, PE_L: gl.constexpr):
    """cp.async of one tile's latent [BLOCK_N, R] and rope key [BLOCK_N, P]; tokens past `end` are zero-filled."""
    tok = first + gl.arange(0, BLOCK_N, gl.SliceLayout(1, LAT_L))
    rr = gl.arange(0, R, gl.SliceLayout(0, LAT_L))
    row = kv_ptr + blk_l.to(gl.int64) * s_kvb + (tok % PAGE) * s_kvt
    ok = gl.expand_dims(tok < end, 1) & gl.expand_dims(rr < R, 0)
    async_copy.async_copy_global_to_shared(lat_buf, gl.expand_dims(row, 1) + gl.expand_dims(rr, 0), mask=ok)
    tok_p = first + gl.arange(0, BLOCK_N, gl.SliceLayout(1, PE_L))
    rp = gl.arange(0, P, gl.SliceLayout(0, PE_L))
    row_p = kv_ptr + blk_p.to(gl.int64) * s_kvb + (tok_p % PAGE) * s_kvt + R
    ok_p = gl.expand_dims(tok_p < end, 1) & gl.expand_dims(rp < P, 0)
    async_copy.async_copy_global_to_shared(pe_buf, gl.expand_dims(row_p, 1) + gl.expand_dims(rp, 0), mask=ok_p)


@gluon.jit
def _prefetch_l2(kv_ptr, blk, first, s_kvb, s_kvt, PAGE: gl.constexpr, BLOCK_N: gl.constexpr,
                 ROW_BYTES: gl.constexpr, PF_L: gl.constexpr):
    """Ask L2 for every 128-byte line of a tile's rows (a hint: nothing waits for it, no shared memory)."""
    LINES: gl.constexpr = ROW_BYTES // 128
    tok = first + gl.arange(0, BLOCK_N, gl.SliceLayout(1, PF_L))
    line = gl.minimum(gl.arange(0, 16, gl.SliceLayout(0, PF_L)), LINES - 1)  # a row's 9 lines, some twice
    row = kv_ptr + blk.to(gl.int64) * s_kvb + (tok % PAGE) * s_kvt
    ptrs = gl.expand_dims(row, 1) + gl.expand_dims(line * (1024 // kv_ptr.dtype.element_ty.primitive_bitwidth), 0)
    gl.inline_asm_elementwise("mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=gl.int32,
                              is_pure=False, pack=1)


# sizes that change per step, as triton_attention.DECODE_UNSPECIALISED (which imports this module lazily)
@gluon.jit(do_not_specialize=("num_splits", "s_tb", "s_lb", "s_lh"))
def mla_decode_hopper(
    q_lat_ptr, q_pe_ptr, kv_ptr, tables_ptr, lens_ptr, out_ptr, lse_ptr,
    num_splits, qk_scale,
    s_qlb, s_qlh, s_qpb, s_qph,
    s_kvb, s_kvt, s_tb,
    s_ob, s_oh, s_os, s_lb, s_lh,
    H: gl.constexpr, R: gl.constexpr, P: gl.constexpr, PAGE: gl.constexpr,
    BLOCK_N: gl.constexpr, NBUF: gl.constexpr, DIRECT: gl.constexpr, PREFETCH: gl.constexpr,
):
    """Grid (B, num_splits), 8 warps. Writes the normalised output, or a split's partial and its lse."""
    b = gl.program_id(0)
    split = gl.program_id(1)
    dt: gl.constexpr = q_lat_ptr.dtype.element_ty
    NW: gl.constexpr = gl.num_warps()
    LAT_L: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [NW, 1], [1, 0])  # 16-byte pieces of 512-wide rows
    PE_L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])  # 16-byte pieces of 64-wide rows
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, BLOCK_N // 2, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, R // 2, 16])
    PF_L: gl.constexpr = gl.BlockedLayout([1, 1], [2, 16], [NW, 1], [1, 0])  # [tokens, 16 lines]
    SMEM: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    lat_s = gl.allocate_shared_memory(dt, [NBUF, BLOCK_N, R], SMEM)
    pe_s = gl.allocate_shared_memory(dt, [NBUF, BLOCK_N, P], SMEM)
    # the probabilities, the output product's A operand: each warpgroup writes its half of the tokens
    p_s = gl.allocate_shared_memory(dt, [H, BLOCK_N], gl.NVMMASharedLayout.get_default_for([H, BLOCK_N], dt))

    # this split's slice of the context, in whole tiles; trailing splits may be empty
    ctx = gl.load(lens_ptr + b).to(gl.int32)
    per_split = gl.cdiv(gl.cdiv(ctx, BLOCK_N), num_splits)
    start = split * per_split * BLOCK_N
    end = gl.minimum(start + per_split * BLOCK_N, ctx)
    n = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)
    tables_row = tables_ptr + b * s_tb

    # the query joins the first tile's copy group: no register round trip, no wait of its own
    hq = gl.arange(0, H, gl.SliceLayout(1, LAT_L))
    rr = gl.arange(0, R, gl.SliceLayout(0, LAT_L))
    q_lat_ptrs = q_lat_ptr + b * s_qlb + gl.expand_dims(hq, 1) * s_qlh + gl.expand_dims(rr, 0)
    hp = gl.arange(0, H, gl.SliceLayout(1, PE_L))
    rp = gl.arange(0, P, gl.SliceLayout(0, PE_L))
    q_pe_ptrs = q_pe_ptr + b * s_qpb + gl.expand_dims(hp, 1) * s_qph + gl.expand_dims(rp, 0)
    q_lat_s = gl.allocate_shared_memory(dt, [H, R], SMEM)
    q_pe_s = gl.allocate_shared_memory(dt, [H, P], SMEM)
    async_copy.async_copy_global_to_shared(q_lat_s, q_lat_ptrs)
    async_copy.async_copy_global_to_shared(q_pe_s, q_pe_ptrs)
    for i in gl.static_range(NBUF - 1):  # prologue: the first NBUF - 1 tiles in flight
        first = start + i * BLOCK_N
        blk_l = _block_ids(tables_row, first, end, BLOCK_N, PAGE, gl.SliceLayout(1, LAT_L))
        blk_p = _block_ids(tables_row, first, end, BLOCK_N, PAGE, gl.SliceLayout(1, PE_L))
        _copy_tile(lat_s.index(i), pe_s.index(i), kv_ptr, blk_l, blk_p, first, end, s_kvb, s_kvt,
                   R, P, PAGE, BLOCK_N, LAT_L, PE_L)
        async_copy.commit_group()
    first = start + (NBUF - 1) * BLOCK_N
    blk_l = _block_ids(tables_row, first, end, BLOCK_N, PAGE, gl.SliceLayout(1, LAT_L))
    blk_p = _block_ids(tables_row, first, end, BLOCK_N, PAGE, gl.SliceLayout(1, PE_L))

    m_i = gl.full([H], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))
    l_e = gl.zeros([H, BLOCK_N], gl.float32, S_L)  # running sums per element, reduced over the tokens at the end
    acc = gl.zeros([H, R], gl.float32, O_L)
    cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, S_L))
    for t in range(0, n):
        nxt = t + NBUF - 1  # the tile whose copy this iteration issues, into the buffer of tile t - 1
        async_copy.wait_group(NBUF - 2)  # this thread's pieces of tile t (and of the query) have landed,
        fence_async_shared()  # are ordered before the tensor cores' reads,
        gl.thread_barrier()  # and so are every other thread's; every warpgroup is also done with tile t - 1
        lat = lat_s.index(t % NBUF)
        pe = pe_s.index(t % NBUF)
        s = warpgroup_mma(q_lat_s, lat.permute((1, 0)), gl.zeros([H, BLOCK_N], gl.float32, S_L), is_async=True)
        s = warpgroup_mma(q_pe_s, pe.permute((1, 0)), s, is_async=True)
        # under the score product, tile t + NBUF - 1 into the buffer the barrier above released (zero-filled
        # when past the slice: the copy is still issued so that the group count stays regular)
        _copy_tile(lat_s.index(nxt % NBUF), pe_s.index(nxt % NBUF), kv_ptr, blk_l, blk_p, start + nxt * BLOCK_N,
                   end, s_kvb, s_kvt, R, P, PAGE, BLOCK_N, LAT_L, PE_L)
        async_copy.commit_group()
        first = start + (nxt + 1) * BLOCK_N  # table entries of the next copy, loaded a whole iteration early
        blk_l = _block_ids(tables_row, first, end, BLOCK_N, PAGE, gl.SliceLayout(1, LAT_L))
        blk_p = _block_ids(tables_row, first, end, BLOCK_N, PAGE, gl.SliceLayout(1, PE_L))
        s = warpgroup_mma_wait(0, deps=[s])
        s = s * qk_scale  # scale * log2(e): the softmax runs in base 2
        tok = start + t * BLOCK_N + cols
        s = gl.where(gl.expand_dims(tok < end, 0), s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))  # finite: every tile has a token of the slice
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - gl.expand_dims(m_new, 1))
        l_e = l_e * gl.expand_dims(alpha, 1) + p
        m_i = m_new
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, O_L)), 1)
        p_s.store(p.to(dt))  # both warpgroups read all of it: fenced for the tensor cores, then a barrier
        fence_async_shared()
        gl.thread_barrier()
        acc = warpgroup_mma(p_s, lat, acc, is_async=True)
        if PREFETCH:  # under the output product: the tile after the next copy, into L2 only
            first = start + (nxt + 1) * BLOCK_N
            blk_f = _block_ids(tables_row, first, end, BLOCK_N, PAGE, gl.SliceLayout(1, PF_L))
            _prefetch_l2(kv_ptr, blk_f, first, s_kvb, s_kvt, PAGE, BLOCK_N, (R + P) * dt.primitive_bitwidth // 8, PF_L)
        acc = warpgroup_mma_wait(0, deps=[acc])
    async_copy.wait_group(0)
    l_i = gl.sum(l_e, axis=1)

    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, O_L))
    nonempty = l_o > 0.0
    o = acc / gl.expand_dims(gl.where(nonempty, l_o, 1.0), 1)
    ho = gl.arange(0, H, gl.SliceLayout(1, O_L))
    ro = gl.arange(0, R, gl.SliceLayout(0, O_L))
    o_ptrs = out_ptr + b * s_ob + gl.expand_dims(ho, 1) * s_oh + gl.expand_dims(ro, 0)
    if DIRECT:
        gl.store(o_ptrs, o.to(out_ptr.dtype.element_ty))
    else:
        gl.store(o_ptrs + split * s_os, o)
        m_o = gl.convert_layout(m_i, gl.SliceLayout(1, O_L))
        lse = gl.where(nonempty, m_o + gl.log2(gl.where(nonempty, l_o, 1.0)), float("-inf"))
        gl.store(lse_ptr + b * s_lb + ho * s_lh + split, lse)
