"""Which routed-expert MoE kernel runs where, with which tiles, and how far K is split: the one table.

Two kernel families, each one gate/up kernel and one down kernel around the shared glue
(`triton_moe_glue`: pair alignment, bridge, combine, the host-side run):

| where | family | why |
| --- | --- | --- |
| NVIDIA GPU without FP4 units (Hopper) | `triton_moe_fast.fused_moe_fast`: load-time word layout, E2M1 decoded in inline PTX straight into the wgmma operand, weights and scales through tensor descriptors (TMA), weight rows on the MMA's wide side | 2.6x / 2.6x / 2.6x / 2.3x / 1.7x faster than `tl.dot_scaled` at 4 / 32 / 128 / 1024 / 8192 tokens on an H200 (bench/results/2026-12-01_h200_moe4) |
| GPU with FP4 units (Blackwell, gfx950), ROCm, the CPU interpreter | `triton_moe.fused_moe_mxfp4`: the checkpoint layout through `tl.dot_scaled` | the native scaled MMA there; the fast path's decode is CUDA PTX (not run on ROCm); the interpreter runs `tl.dot_scaled` |
| Hopper, experts whose scales the word layout cannot hold (above 2^1) | `fused_moe_mxfp4` | the fallback (`moe_fast_layout.ScaleRangeError`) |

Tiles are picked by pairs per expert (T * k / E); the rows below (`FAST_TILES`; `SCALED_BLOCK_M`,
`SCALED_COLUMNS`, `SCALED_PREFILL`) carry the measurements that chose them. Every choice depends on shapes
alone: no host sync, so a decode step can be captured in a CUDA graph. Tests pin the choices (tests/engine/kernels/test_moe_dispatch.py).

What was measured and deleted, each slower on every engine shape it was timed at (H200, same sweep):
- the nibble-half layout: the word layout was 7 / 13 / 13 / 5 / 5% faster at 4 / 32 / 128 / 1024 / 8192
  tokens (0.312 / 1.490 / 2.909 / 4.518 / 19.4 ms against 0.335 / 1.723 / 3.364 / 4.761 / 20.3), outputs
  bit-identical (moe4);
- the per-element Triton decode on a GPU: 52 / 51 / 51% slower than the PTX decode at 4 / 32 / 128 tokens
  on the same tiles, 10.6 against 4.9 ms for the dispatched tiles at 1024 (moe3); the same bit programs in
  Triton integer ops stay as the interpreter's form;
- pointer loads of weights and scales: their best tiles took 0.442 / 2.018 / 3.810 / 7.525 / 29.4 ms at
  4 / 32 / 128 / 1024 / 8192 tokens against 0.368 / 1.768 / 3.470 / 4.901 / 20.0 on descriptors (moe3);
- tokens on the MMA's wide side (unswapped): 1-2% slower than the same swapped tiles at 4 / 32 / 128 tokens
  and, at 8192, 29.7 ms at best (128x128, pointer loads; moe) against 22.9 for swapped tiles on descriptors
  (moe3 first call); the word layout's decode targets the swapped operand only;
- four 64-wide chunks a K step in the fast family: 180 registers for the down kernel at 128 rows a
  program (sm_90 ptxas); at 64 rows 0.318 / 1.631 / 3.224 ms at 4 / 32 / 128 tokens against 0.308 / 1.469 /
  2.940 for one chunk a step at 128 rows (bench/results/2026-12-03_h200_session10, moe_chunks_first.json);
- the explicit dequantisation before `tl.dot` in the checkpoint-layout family: 17-21% slower than
  `tl.dot_scaled` at 4 / 32 / 128 tokens with the default tiles (1.40 / 5.84 / 10.81 against 1.19 / 4.80 /
  8.90 ms, TP 1, bench/results/2026-11-30_h200_engine/kernel_tune.json), 28.9 against 24.8 ms at its best
  at 8192 (TP 2), and both far behind the fast family where they would upcast (Hopper).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton


def native_fp4(device: torch.device) -> bool:
    """Whether the GPU multiplies FP4 natively (Blackwell, or gfx950 under ROCm); the CPU interpreter
    counts as native so the tests exercise the FP4 x FP4 form."""
    if device.type != "cuda":
        return True
    if torch.version.hip:
        return "gfx95" in torch.cuda.get_device_properties(device).gcnArchName
    return torch.cuda.get_device_capability(device) >= (10, 0)


MOE_KERNELS = ("fast", "dot_scaled")


def moe_kernel(device: torch.device) -> str:
    """The family of the table above: "fast" on an NVIDIA GPU without FP4 units, else "dot_scaled"."""
    return "fast" if device.type == "cuda" and not torch.version.hip and not native_fp4(device) else "dot_scaled"


STEP_CHUNKS = (1, 2)  # chunks per K step the fast kernels take (four measured slower everywhere, FAST_TILES)


@dataclass(frozen=True)
class FastTiles:
    """Tiles of one `fused_moe_fast` call: block_m pairs per block (the MMA's narrow side), block_n weight
    rows per program (two 64-row wgmma tiles at 128); prefetch: the next step's activations are loaded in
    registers a step ahead (weights and scales are always pipelined num_stages deep by the descriptors);
    chunks / down_chunks: 64-wide K chunks per step of the gate/up / down GEMM, whose words and scales come
    in one copy each (down_chunks None: as chunks)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    prefetch: bool
    chunks: int = 1
    down_chunks: int | None = None

    def __post_init__(self) -> None:
        for name, n in (("chunks", self.chunks), ("down_chunks", self.down_chunks)):
            if n is not None and n not in STEP_CHUNKS:
                raise ValueError(f"{name} must be one of {STEP_CHUNKS}, got {n}")

    def step_chunks(self) -> tuple[int, int]:
        """Chunks per K step of (gate/up, down)."""
        return self.chunks, self.chunks if self.down_chunks is None else self.down_chunks


@dataclass(frozen=True)
class ScaledTiles:
    """Tiles of one `fused_moe_mxfp4` call (num_stages None: Triton's default)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int | None


# The fast family on an H200 (E=384, H=7168, L=2048, top 8, A4W4, CUDA-graph replays,
# bench/engine_moe_gpu_bench.py; bench/results/2026-12-01_h200_moe3 and _moe4, 2026-12-03_h200_session10),
# rows by pairs per expert. Chunks per K step: the down GEMM (K = 2048, 32 chunks a program) gains from
# two chunks a copy at every size; gate/up (K = 7168) loses at decode sizes, where the step's 159 registers
# (against 119, sm_90 ptxas) leave fewer programs per SM, and gains at prefill; four chunks a step
# (180 registers) lost everywhere.
FAST_TILES = {
    # <= 16 pairs per expert (decode up to 768 tokens). Down, 2 chunks a step: 0.086 / 0.464 / 0.943 ms at 4 /
    # 32 / 128 tokens against 0.101 / 0.514 / 1.048 with one; gate/up, 1 chunk: 0.182 / 0.930 / 1.828 against
    # 0.218 / 0.941 / 1.881 with two (3 stages; 4 within 1%). Earlier: 256 rows 5-6% slower; 256 rows on 8
    # warps 14-19% slower; 32-pair blocks 26-43% slower; without the activation prefetch 70-76% slower.
    "decode": FastTiles(block_m=16, block_n=128, num_warps=4, num_stages=3, prefetch=True, chunks=1, down_chunks=2),
    # 16 to 128 pairs per expert: at 1024 tokens down 1.488 ms with 2 chunks a step (3 stages) against 1.740
    # with one; gate/up 2.587 (1 chunk, 4 stages) against 2.806 (2 chunks, 3 stages); the decode tiles 5.9
    "batched": FastTiles(block_m=32, block_n=128, num_warps=4, num_stages=3, prefetch=True, chunks=1, down_chunks=2),
    # >= 128 pairs per expert (prefill): 17.6 ms, 327 TFLOP/s at 8192 tokens with 2 chunks a step and 3 stages,
    # against 19.2 with one chunk and 4 stages and 32.5 for tl.dot_scaled; in the moe3 first call (nibble
    # layout) 22.9 ms, with the register prefetch 37.6, 64x64 tiles on 4 warps 24.6
    "prefill": FastTiles(block_m=64, block_n=128, num_warps=8, num_stages=3, prefetch=False, chunks=2),
}
FAST_DECODE_PAIRS = 16  # pairs per expert up to which the decode row runs
FAST_PREFILL_PAIRS = 128  # pairs per expert from which the prefill row runs


def fast_tiles(num_pairs: int, num_experts: int) -> FastTiles:
    per_expert = num_pairs / max(1, num_experts)
    if per_expert >= FAST_PREFILL_PAIRS:
        return FAST_TILES["prefill"]
    return FAST_TILES["decode" if per_expert <= FAST_DECODE_PAIRS else "batched"]


# The dot_scaled family, measured on an H200 (where it upcasts; no FP4 GPU has run it yet). Rows of pairs
# per expert -> block_m, then the columns by pairs:
SCALED_PREFILL_PAIRS = 128  # pairs per expert from which the prefill row runs
SCALED_BLOCK_M = (
    (16, 16),  # <= 16 pairs per expert (decode): 16-pair blocks
    (48, 32),  # <= 48: blocks the experts' groups fill (not swept on their own)
    (SCALED_PREFILL_PAIRS, 64),  # below SCALED_PREFILL_PAIRS
)
SCALED_COLUMNS = {
    # below 256 pairs: 64 columns, Triton's default stages (1.19 ms at 4 tokens against 1.22 with 128
    # columns and 3 stages, TP 1 widths, bench/results/2026-11-30_h200_engine/kernel_tune.json)
    "narrow": (64, 4, None),
    # from 256 pairs (32 tokens x top 8): 128 columns, 3 stages (4.29 against 4.80 ms at 32 tokens, 7.90
    # against 8.90 at 128; same file)
    "wide": (128, 4, 3),
}
SCALED_WIDE_PAIRS = 256
# >= 128 pairs per expert (prefill): 24.9 against 28.7 ms at 8192 tokens, TP 2 widths
# (bench/results/h200_kernels/kernel_tune_moe_prefill.json)
SCALED_PREFILL = ScaledTiles(block_m=128, block_n=128, num_warps=8, num_stages=3)


def scaled_tiles(num_pairs: int, num_experts: int) -> ScaledTiles:
    per_expert = num_pairs / max(1, num_experts)
    if per_expert >= SCALED_PREFILL_PAIRS:
        return SCALED_PREFILL
    block_m = next(bm for limit, bm in SCALED_BLOCK_M if per_expert <= limit)
    cols = SCALED_COLUMNS["wide" if num_pairs >= SCALED_WIDE_PAIRS else "narrow"]
    return ScaledTiles(block_m, *cols)


# Split-K: when a launch has too few programs to keep the GPU's memory pipes busy, K is cut into slices
# that run as separate programs, each writing float32 partial sums that are added after (in a fixed order:
# deterministic). Aim for ~8 programs per SM of an H200 (132 SMs) with at least MIN_SPLIT_TILES K tiles
# per slice. Used by the MXFP4 linear at decode sizes (`triton_backend.gemm_split_k`), the dense MLP as a
# one-expert fast MoE (`triton_backend._dense_split`, which also caps the partials' bytes) and on request
# by the checkpoint-layout MoE (`triton_moe.moe_split_k`; its default is no split: 1.53 against 1.53 ms at
# 4 tokens, 3.72 against 3.43 at 32, bench/results/h200_kernels/kernel_tune_tp2_split.json). The routed
# fast MoE runs unsplit: split 2 was 2-8% slower on descriptors at 4 / 32 / 128 tokens (moe3).
SPLIT_TARGET_PROGRAMS = 1056
MIN_SPLIT_TILES = 4


def split_k(programs: int, k_tiles: int, max_slices: int | None = None) -> int:
    """How many K slices a launch of `programs` programs, each over `k_tiles` K tiles, should use (at most
    max_slices)."""
    if programs >= SPLIT_TARGET_PROGRAMS:
        return 1
    want = triton.cdiv(SPLIT_TARGET_PROGRAMS, max(1, programs))
    slices = max(1, min(want, k_tiles // MIN_SPLIT_TILES))
    return slices if max_slices is None else max(1, min(slices, max_slices))
