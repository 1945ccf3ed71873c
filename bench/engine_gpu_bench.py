"""Decode-step and prefill time of the bundled engine on one GPU, per kernel variant, against the roofline.

Loads a full-width checkpoint (e.g. `k2bench engine tiny --preset kimi-k2-width --layers 2 --device cuda`)
once, then for each batch size B runs decode steps of B sequences that each hold `--ctx` cached tokens
(random latents in a paged cache with scattered blocks) through each variant:

- `torch`: the reference backend (absorbed attention over gathered context, torch MoE paths)
- `triton:<moe kernel>`: the triton backend (paged split-KV decode kernel, fused MXFP4 MoE kernel,
  MXFP4 GEMMs) with the named MoE kernel family (`fast` or `dot_scaled`, engine/kernels/moe_dispatch.py;
  plain `triton` takes the dispatched one)

Each variant's logits are compared with the torch backend's on the same step (max |diff| / max |ref|
and greedy-token agreement), so a fast variant that computes the wrong thing shows here. The floor
of a decode step is the bytes it must read (weights this rank uses, experts the batch is expected to
touch, the latent cache of every sequence; bench/decode_roofline.py's count) over the measured copy
bandwidth. Medians of CUDA-event timings; prints a table and writes JSON.

    python bench/engine_gpu_bench.py --model /tmp/k2w --batches 4,32,128 --ctx 8192 --out /tmp/out
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from k2bench.engine.kernels import get_backend
from k2bench.engine.model.attn_meta import AttentionMetadata
from k2bench.engine.model.loader import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_roofline import step_bytes, tensor_bytes  # noqa: E402

BLOCK = 16
SPREAD_SEEDS = 4  # perturbed torch runs per float32 check case


def copy_bandwidth_gbs() -> float:
    x = torch.randn(1 << 30, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        y.copy_(x)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del x, y
    return 2 * (1 << 30) * 4 / statistics.median(times) / 1e9


def cuda_time_ms(fn, reps: int, warmup: int = 2) -> tuple[float, list[float]]:
    """Median and every sample (ms) of `reps` calls of fn, each between two CUDA events, after `warmup`
    untimed calls (compiles, caches): the one event timer of the GPU bench scripts."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), times


def decode_inputs(batch: int, ctx: int, num_blocks: int, vocab: int, gen: torch.Generator):
    per_seq = -(-ctx // BLOCK)
    blocks = torch.randperm(num_blocks - 1, generator=gen)[: batch * per_seq].view(batch, per_seq)  # never the last
    pos = torch.full((batch,), ctx - 1, dtype=torch.int64)
    slots = blocks[:, (ctx - 1) // BLOCK] * BLOCK + (ctx - 1) % BLOCK
    meta = AttentionMetadata(
        cu_seqlens_q=torch.arange(batch + 1, dtype=torch.int64).cuda(),
        context_lens=torch.full((batch,), ctx, dtype=torch.int64).cuda(),
        slot_mapping=slots.cuda(),
        block_tables=blocks.cuda(),
        block_size=BLOCK,
    )
    ids = torch.randint(0, vocab, (batch,), generator=gen).cuda()
    return ids, pos.cuda(), meta


def prefill_inputs(n: int, num_blocks: int, vocab: int, gen: torch.Generator):
    nblk = -(-n // BLOCK)
    blocks = torch.randperm(num_blocks, generator=gen)[:nblk].view(1, nblk)
    pos = torch.arange(n, dtype=torch.int64)
    slots = blocks[0, pos // BLOCK] * BLOCK + pos % BLOCK
    meta = AttentionMetadata(
        cu_seqlens_q=torch.tensor([0, n], dtype=torch.int64).cuda(),
        context_lens=torch.tensor([n], dtype=torch.int64).cuda(),
        slot_mapping=slots.cuda(),
        block_tables=blocks.cuda(),
        block_size=BLOCK,
    )
    return torch.randint(0, vocab, (n,), generator=gen).cuda(), pos.cuda(), meta


def float32_check(model_dir: Path, variants: list[str], gen: torch.Generator, ctx: int = 1024, batch: int = 4,
                  prompt: int = 512) -> list[dict]:
    """Every variant against the torch backend with the model in float32, one decode step and one prefill.

    In bf16 the variants' rounding differs (and a random router flips experts on tiny differences),
    so the bf16 timing rows only show how far apart they land; this is the correctness check: in
    float32 (A4W4's FP4 products are exact) only summation order separates the backends.

    Summation order alone is not 1e-7 everywhere, though: A4W4 rounds every activation to the E2M1 grid,
    a step function, so a last-bit difference that lands an activation on the other side of a rounding
    boundary moves it by a whole FP4 step, and the logits by ~1e-2 (the prefill's 3e-2 in every H200 run:
    512 tokens feed the last one's attention, against 4 tokens in the decode case). The torch backend does
    the same against itself: `bench/a4w4_sensitivity.py` shows it on CPU. So the bound is measured here:
    the torch backend is run again with its embeddings scaled by 1 + 1e-7 noise (SPREAD_SEEDS draws, the
    size of a summation-order difference), and each variant's row says whether its error is within the
    largest of those (`within_torch_spread`), the reference's own spread at this input."""
    # loaded for the torch backend, which keeps the experts' checkpoint layout: every variant swapped in
    # below can run on it (a triton load would keep only the fast layout; the triton variants here build
    # theirs on first use, so both layouts are held while this bench runs)
    model, cfg = load_model(model_dir, device="cuda", dtype="float32", backend="torch")
    num_blocks = batch * -(-ctx // BLOCK) + -(-prompt // BLOCK) + 8
    caches = [torch.randn(num_blocks, BLOCK, cfg.kv_cache_dim, device="cuda") for _ in range(cfg.num_hidden_layers)]
    cases = {"decode": decode_inputs(batch, ctx, num_blocks, cfg.vocab_size, gen),
             "prefill": prefill_inputs(prompt, num_blocks, cfg.vocab_size, gen)}
    rows = []
    for kind, (ids, pos, meta) in cases.items():
        logits_of = functools.partial(_check_logits, model, caches, ids, pos, meta, kind == "prefill")
        ref = logits_of("torch")
        spread = 0.0  # the torch backend against itself under last-bit input noise (see the docstring)
        emb = model.embed_tokens.data
        keep = emb.clone()
        for seed in range(SPREAD_SEEDS):
            noise = torch.randn(emb.shape, generator=torch.Generator(emb.device).manual_seed(seed), device=emb.device)
            emb.mul_(1 + 1e-7 * noise)
            spread = max(spread, float((logits_of("torch") - ref).abs().max() / ref.abs().max()))
            emb.copy_(keep)
        print(f"float32 check {kind:<8} torch vs itself under 1e-7 input noise: rel err up to {spread:.2e}", flush=True)
        for v in variants:
            logits = logits_of(v)
            err = float((logits - ref).abs().max() / ref.abs().max())
            agree = float((logits.argmax(-1) == ref.argmax(-1)).float().mean())
            within = err <= max(spread, 1e-5)
            rows.append({"kind": f"float32_check_{kind}", "variant": v, "rel_err_vs_torch": err, "argmax_agree": agree,
                         "torch_spread": spread, "within_torch_spread": within})
            print(f"float32 check {kind:<8} {v:<20} rel err {err:.2e}  argmax agree {agree:.2f}  "
                  f"{'within' if within else 'OUTSIDE'} torch's own spread", flush=True)
    del model, caches
    torch.cuda.empty_cache()
    return rows


def _check_logits(model, caches, ids, pos, meta, last_only: bool, variant: str) -> torch.Tensor:
    """One forward of the float32 check through `variant`, on a copy of the caches (each run sees the same)."""
    object.__setattr__(model.par, "backend", make_backend(variant))
    h = model(ids, pos, meta, [c.clone() for c in caches])
    return model.compute_logits(h[-1:] if last_only else h)


def make_backend(variant: str):
    """`torch`, `triton`, `triton:<moe kernel>`, with `:graphs` at the end for CUDA-graph replays
    (e.g. `triton:graphs`, `triton:dot_scaled:graphs`)."""
    if variant == "torch":
        return get_backend("torch", "cuda")
    name, *rest = variant.split(":")
    b = get_backend(name, "cuda")
    moe = [r for r in rest if r != "graphs"]
    if moe:
        b.moe_variant = moe[0]
    return b


def graph_step(model, caches, batch: int, ctx: int, num_blocks: int, ids, pos, meta):
    """A decode step of `batch` replayed from a CUDA graph (engine.cuda_graphs), on the bench's caches:
    the last cache block is the scratch block (decode_inputs never hands it out)."""
    from k2bench.engine.runtime.cuda_graphs import DecodeGraphs

    graphs = DecodeGraphs(model, caches, scratch_block=num_blocks - 1, block_size=BLOCK,
                          max_blocks=meta.block_tables.shape[1], max_batch=batch, device=torch.device("cuda"),
                          buckets=[batch])
    graphs.capture()
    return lambda: graphs.run(ids, pos, meta.slot_mapping, meta.context_lens, meta.block_tables)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--batches", default="4,32,128")
    ap.add_argument("--ctx", type=int, default=8192, help="cached tokens per sequence in the decode steps")
    ap.add_argument("--variants", default="torch,triton,triton:graphs")
    ap.add_argument("--prefill", type=int, default=8192, help="tokens of the timed one-sequence prefill (0: skip)")
    ap.add_argument("--prefill-variants", default="torch,triton")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-check", dest="check", action="store_false", help="skip the float32 correctness check")
    ap.add_argument("--check-only", action="store_true", help="only the float32 check (float32_check.json)")
    ap.add_argument("--profile", action="store_true", help="torch.profiler tables of one triton decode step at the largest batch and of the prefill")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    variants = args.variants.split(",")

    bw = copy_bandwidth_gbs()
    gen = torch.Generator().manual_seed(0)
    rows = float32_check(args.model, variants, gen) if args.check else []
    if args.check_only:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "float32_check.json").write_text(json.dumps({"model": str(args.model), "rows": rows}, indent=1))
        return 0
    t0 = time.perf_counter()
    model, cfg = load_model(args.model, device="cuda", dtype=args.dtype, backend="torch")  # see float32_check
    load_s = time.perf_counter() - t0
    print(f"copy bandwidth {bw:.0f} GB/s; model loaded in {load_s:.1f} s; quant mode {model.quant_mode}", flush=True)
    cfg_json = json.loads((args.model / "config.json").read_text())
    sizes = tensor_bytes(args.model)
    num_blocks = max(batches) * -(-args.ctx // BLOCK) + 64
    kv_dtype = model.embed_tokens.dtype
    caches = [torch.randn(num_blocks, BLOCK, cfg.kv_cache_dim, device="cuda").to(kv_dtype)
              for _ in range(cfg.num_hidden_layers)]
    backends = {v: make_backend(v) for v in variants}

    def step(ids, pos, meta, last_only=False):
        h = model(ids, pos, meta, caches)
        return model.compute_logits(h[-1:] if last_only else h)

    for batch in batches:
        ids, pos, meta = decode_inputs(batch, args.ctx, num_blocks, cfg.vocab_size, gen)
        b = step_bytes(sizes, cfg_json, 1, batch, args.ctx, kv_dtype.itemsize)
        floor_ms = b["total"] / (bw * 1e9) * 1e3
        ref = None
        for v in variants:
            object.__setattr__(model.par, "backend", backends[v])  # Parallel is frozen; every layer shares it
            try:
                if v.endswith(":graphs"):
                    fn = graph_step(model, caches, batch, args.ctx, num_blocks, ids, pos, meta)
                else:
                    fn = functools.partial(step, ids, pos, meta)
                logits = fn().clone()
                med, times = cuda_time_ms(fn, args.reps)
            except Exception as exc:  # noqa: BLE001 - a failing variant is a result, the others still run
                print(f"B={batch} {v}: FAILED {type(exc).__name__}: {exc}", flush=True)
                rows.append({"kind": "decode", "batch": batch, "variant": v, "error": f"{type(exc).__name__}: {exc}"})
                torch.cuda.empty_cache()
                continue
            if ref is None:
                ref = logits
            err = float((logits - ref).abs().max() / ref.abs().max())
            agree = float((logits.argmax(-1) == ref.argmax(-1)).float().mean())
            row = {"kind": "decode", "batch": batch, "ctx": args.ctx, "variant": v, "step_ms": med,
                   "step_ms_all": times, "tok_s": batch / med * 1e3, "floor_ms": floor_ms,
                   "x_floor": med / floor_ms, "bytes_GB": b["total"] / 1e9, "kv_GB": b["kv"] / 1e9,
                   "experts_touched": b["experts_touched"], "rel_err_vs_first": err, "argmax_agree": agree}
            rows.append(row)
            print(f"B={batch:>4} {v:<20} step {med:8.2f} ms  floor {floor_ms:6.2f} ms  x{med / floor_ms:6.1f}  "
                  f"err {err:.2e}  agree {agree:.2f}", flush=True)
            del logits
        torch.cuda.empty_cache()

    if args.prefill:
        ids, pos, meta = prefill_inputs(args.prefill, num_blocks, cfg.vocab_size, gen)
        ref = None
        for v in args.prefill_variants.split(","):
            object.__setattr__(model.par, "backend", make_backend(v))
            try:
                logits = step(ids, pos, meta, last_only=True)
                ref = logits if ref is None else ref
                err = float((logits - ref).abs().max() / ref.abs().max())
                med, times = cuda_time_ms(lambda i=ids, p=pos, m=meta: step(i, p, m, last_only=True), 3, warmup=1)
            except Exception as exc:  # noqa: BLE001
                print(f"prefill {v}: FAILED {type(exc).__name__}: {exc}", flush=True)
                rows.append({"kind": "prefill", "variant": v, "error": f"{type(exc).__name__}: {exc}"})
                continue
            rows.append({"kind": "prefill", "tokens": args.prefill, "variant": v, "ms": med, "ms_all": times,
                         "tok_s": args.prefill / med * 1e3, "rel_err_vs_first": err})
            print(f"prefill {args.prefill} tokens {v:<12} {med:9.1f} ms  {args.prefill / med * 1e3:9.0f} tok/s  "
                  f"last-token logits err {err:.2e}", flush=True)

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        v = next(x for x in variants if x != "torch")
        object.__setattr__(model.par, "backend", backends[v])  # Parallel is frozen; every layer shares it
        ids, pos, meta = decode_inputs(max(batches), args.ctx, num_blocks, cfg.vocab_size, gen)
        step(ids, pos, meta)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step(ids, pos, meta)
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
        (args.out / "profile.txt").write_text(table)
        print(f"profile of one {v} step at B={max(batches)}: {args.out / 'profile.txt'}")
        if args.prefill:
            ids, pos, meta = prefill_inputs(args.prefill, num_blocks, cfg.vocab_size, gen)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step(ids, pos, meta, last_only=True)
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
            (args.out / "profile_prefill.txt").write_text(table)
            print(table)

    doc = {"bandwidth_gbs": bw, "model": str(args.model), "layers": cfg.num_hidden_layers, "load_s": load_s,
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    (args.out / "engine_gpu_bench.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
