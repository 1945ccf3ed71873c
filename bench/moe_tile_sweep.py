"""`fused_moe_fast` at the dispatched block_m over 64/128 weight rows, 4/8 warps, 3/4 stages and split-K 1-3
(gate/up) x 1-2 (down), CUDA-graph replays against the byte floor (one H200); prints a line per config and
writes tiles.json.

    python bench/moe_tile_sweep.py OUT_DIR 4,32,128
"""

from __future__ import annotations

import itertools
import json
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_gpu_bench import copy_bandwidth_gbs  # noqa: E402
from engine_moe_gpu_bench import TOPK, E, H, graph_time_ms, random_mxfp4  # noqa: E402

from k2bench.engine.kernels.moe_dispatch import FastTiles, fast_tiles  # noqa: E402
from k2bench.engine.kernels.moe_fast_layout import relayout_experts  # noqa: E402
from k2bench.engine.kernels.triton_moe_fast import fused_moe_fast  # noqa: E402

L = 2048
GRID = itertools.product([128, 64], [4, 8], [3, 4], [1, 2, 3], [1, 2])  # rows, warps, stages, splits


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tokens = [int(t) for t in sys.argv[2].split(",")]
    bw = copy_bandwidth_gbs()
    w13, s13 = random_mxfp4(E, 2 * L, H)
    w2, s2 = random_mxfp4(E, H, L)
    fast = relayout_experts(w13, s13, w2, s2)
    expert_bytes = w13[0].numel() + s13[0].numel() + w2[0].numel() + s2[0].numel()
    del w13, w2
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    configs = [c for c in GRID if not (c[0] == 64 and c[1] == 8)]
    for T in tokens:
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=gen)
        wts, ids = torch.randn(T, E, device="cuda", generator=gen).softmax(-1).topk(TOPK, dim=-1)
        floor = int(torch.unique(ids).numel()) * expert_bytes / (bw * 1e9) * 1e3
        bm = fast_tiles(T * TOPK, E).block_m
        ref = fused_moe_fast(x, ids, wts, fast, a4w4=True).float()
        for bn, warps, stages, split1, split2 in configs:
            cfg = FastTiles(bm, bn, warps, stages, True)
            fn = partial(fused_moe_fast, x, ids, wts, fast, a4w4=True, config=cfg, split_k=split1,
                         down_split_k=split2)
            try:
                diff = float((fn().float() - ref).abs().max() / ref.abs().max())
                ms = graph_time_ms(fn, 20)
            except Exception as exc:  # noqa: BLE001 - a config that does not compile is a result
                print(T, cfg, split1, split2, "FAILED", str(exc)[:200], flush=True)
                continue
            rows.append(dict(T=T, bm=bm, bn=bn, warps=warps, stages=stages, split1=split1, split2=split2, ms=ms,
                             floor=floor, x=ms / floor, diff=diff))
            print(f"T={T:>4} {bm}x{bn} w{warps} s{stages} split {split1}/{split2}: {ms:.3f} ms x{ms / floor:.2f} "
                  f"diff {diff:.1e}", flush=True)
    (out / "tiles.json").write_text(json.dumps(dict(bw=bw, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
