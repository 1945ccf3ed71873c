"""Speed of the bundled engine's model forward (torch backend) on the tiny checkpoint, without the runtime.

For each weight format / numerics mode: load time, whole-prompt prefill (tokens/s) and batched
decode steps at a given context (tokens/s), each next to the achieved GFLOP/s of the model's
matmuls and attention (a rough count: 2 x active weights per token + absorbed-MLA attention), so a
number can be read against the machine rather than on its own.

    python bench/engine_model_bench.py                  # table + results/bench/engine_model_bench.json
    python bench/engine_model_bench.py --quick --threads 2 --out /tmp/em.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from k2bench.engine.model.attn_meta import AttentionMetadata
from k2bench.engine.model.loader import load_model
from k2bench.engine.model.tiny import write_tiny_checkpoint

CASES = [("mxfp4", "auto"), ("mxfp4", "w4"), ("bf16", "auto")]  # (checkpoint, quant_mode)


def flops_per_token(cfg, ctx: int) -> float:
    """2 x (weights a token multiplies) + absorbed attention over `ctx` keys, summed over layers."""
    h, H = cfg.hidden_size, cfg.num_attention_heads
    qk, r, v = cfg.qk_head_dim, cfg.kv_lora_rank, cfg.v_head_dim
    attn_w = (h * cfg.q_lora_rank + cfg.q_lora_rank * H * qk) if cfg.q_lora_rank else h * H * qk
    attn_w += h * cfg.kv_cache_dim + H * cfg.qk_nope_head_dim * r + H * r * v + H * v * h
    attn_ctx = H * ctx * (cfg.kv_cache_dim + r)
    total = 0.0
    for layer in range(cfg.num_hidden_layers):
        if cfg.is_moe_layer(layer):
            mlp = 3 * h * cfg.moe_intermediate_size * (cfg.num_experts_per_tok + cfg.n_shared_experts)
            mlp += h * cfg.n_routed_experts
        else:
            mlp = 3 * h * cfg.intermediate_size
        total += 2 * (attn_w + mlp + attn_ctx)
    return total + 2 * h * cfg.vocab_size / max(1, ctx)  # lm_head once per sequence, spread over its tokens


def _meta(cu, ctx, slots, tables, bs):
    return AttentionMetadata(torch.tensor(cu), torch.tensor(ctx), slots, tables, bs)


def bench_case(model_dir: Path, quant_mode: str, prefill_lens, decode_batches, decode_ctx, repeats):
    t0 = time.perf_counter()
    model, cfg = load_model(model_dir, dtype="float32", quant_mode=quant_mode)
    load_s = time.perf_counter() - t0
    bs = 16
    need = max(max(prefill_lens), decode_ctx) // bs + 2
    caches = [torch.zeros(need, bs, cfg.kv_cache_dim) for _ in range(cfg.num_hidden_layers)]
    rows = []
    g = torch.Generator().manual_seed(0)
    for n in prefill_lens:
        ids = torch.randint(0, cfg.vocab_size, (n,), generator=g)
        meta = _meta([0, n], [n], torch.arange(n), torch.arange(need).unsqueeze(0), bs)
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            model(ids, torch.arange(n), meta, caches)
            best = min(best, time.perf_counter() - t)
        fl = flops_per_token(cfg, (n + 1) // 2) * n  # causal: on average half the prompt is visible
        rows.append({"phase": "prefill", "tokens": n, "batch": 1, "ctx": n, "seconds": best,
                     "tok_per_s": n / best, "gflop_per_s": fl / best / 1e9})
    for b in decode_batches:  # every sequence reads the same cached context (fine for timing)
        tables = torch.arange(decode_ctx // bs + 1).repeat(b, 1)
        meta = _meta(list(range(b + 1)), [decode_ctx] * b, torch.full((b,), decode_ctx - 1), tables, bs)
        ids = torch.randint(0, cfg.vocab_size, (b,), generator=g)
        pos = torch.full((b,), decode_ctx - 1)
        model(ids, pos, meta, caches)
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            model(ids, pos, meta, caches)
            best = min(best, time.perf_counter() - t)
        fl = flops_per_token(cfg, decode_ctx) * b
        rows.append({"phase": "decode", "tokens": b, "batch": b, "ctx": decode_ctx, "seconds": best,
                     "tok_per_s": b / best, "gflop_per_s": fl / best / 1e9})
    return load_s, model.quant_mode, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter prompts, fewer batches")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--out", default="results/bench/engine_model_bench.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    prefill = [256, 1024] if args.quick else [512, 2048, 4096]
    batches = [1, 16] if args.quick else [1, 32, 128]
    ctx = 512 if args.quick else 2048
    repeats = 1 if args.quick else 2
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {q: write_tiny_checkpoint(Path(tmp) / q, quant=q) for q in {c for c, _ in CASES}}
        for ckpt, mode in CASES:
            load_s, resolved, rows = bench_case(dirs[ckpt], mode, prefill, batches, ctx, repeats)
            for r in rows:
                results.append({"checkpoint": ckpt, "quant_mode": resolved, "load_s": load_s, **r})
    print(f"{'ckpt':6} {'mode':5} {'phase':7} {'batch':>5} {'tokens':>6} {'ctx':>5} {'seconds':>8} {'tok/s':>9} {'GFLOP/s':>8}")
    for r in results:
        print(f"{r['checkpoint']:6} {r['quant_mode']:5} {r['phase']:7} {r['batch']:5d} {r['tokens']:6d} {r['ctx']:5d} "
              f"{r['seconds']:8.3f} {r['tok_per_s']:9.1f} {r['gflop_per_s']:8.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    print(f"load average during the run: {load[0]:.1f} (1 min) on {os.cpu_count()} cores; shared machines make this noisy")
    out.write_text(json.dumps({
        "bench": "engine_model", "threads": args.threads, "loadavg": load, "cpus": os.cpu_count(), "torch": torch.__version__,
        "machine": platform.machine(), "processor": platform.processor(), "dtype": "float32",
        "results": results,
    }, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
