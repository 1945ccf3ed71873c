"""What automatic prefix caching costs and saves in the bundled engine.

Two parts:
- bookkeeping: the block manager alone admitting, committing and releasing long prompts (half of each
  one shared prefix), caching on and off: microseconds per request, so the hashing's price is known;
- the engine on the tiny checkpoint: prompts half made of one shared prefix, primed with one request,
  then all at once, caching on and off: prompt tokens the model ran, hit rate, and the batch's time.

    python bench/prefix_cache_bench.py                  # table + results/bench/prefix_cache_bench.json
    python bench/prefix_cache_bench.py --quick --threads 1 --out /tmp/pc.json
    python bench/prefix_cache_bench.py --device cuda --backend triton   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import tempfile
import time
from pathlib import Path

import torch

from k2bench.engine.runtime.block_manager import BlockManager
from k2bench.engine.runtime.sequence import SamplingParams, Sequence


def half_shared(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(10, 500) for _ in range(length // 2)]
    return [prefix + [rng.randrange(10, 500) for _ in range(length - len(prefix))] for _ in range(n)]


def bookkeeping(caching: bool, n: int, length: int, block: int) -> dict:
    prompts = half_shared(n, length, seed=1)
    bm = BlockManager(n * (length // block + 1), block, enable_caching=caching)
    seqs = [Sequence(p) for p in prompts]
    t0 = time.perf_counter()
    found = 0
    for s in seqs:
        found += bm.allocate(s) or 0
        s.num_computed = s.num_tokens
        bm.commit(s)
    t1 = time.perf_counter()
    for s in seqs:
        bm.free(s)
    t2 = time.perf_counter()
    return {"part": "bookkeeping", "caching": caching, "requests": n, "prompt_len": length, "block_size": block,
            "admit_commit_us": round((t1 - t0) / n * 1e6, 1), "free_us": round((t2 - t1) / n * 1e6, 1),
            "hit_rate": round(found / (n * length), 4)}


def engine_run(model_dir: Path, caching: bool, n: int, length: int, device: str, backend: str) -> dict:
    from k2bench.engine.runtime.build import EngineOptions, build_engine
    from k2bench.engine.runtime.runtime_config import RuntimeConfig

    rt = RuntimeConfig(max_num_seqs=n, max_num_batched_tokens=2048, max_model_len=length + 64, block_size=16,
                       num_kv_blocks=(n + 1) * (length + 64) // 16 + 8, enable_prefix_caching=caching)
    eng = build_engine(EngineOptions(model=str(model_dir), device=device, dtype="float32", backend=backend, runtime=rt))
    try:
        prompts = half_shared(n + 1, length, seed=2)

        def params() -> SamplingParams:
            return SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)

        eng.generate([Sequence(prompts[0], params())])  # priming
        st = eng.stats
        base = (st.prompt_tokens, st.prefix_cache_hits, st.computed_tokens)
        seqs = [Sequence(p, params()) for p in prompts[1:]]
        t0 = time.perf_counter()
        eng.generate(seqs)
        if device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        queries, hits = st.prompt_tokens - base[0], st.prefix_cache_hits - base[1]
        return {"part": "engine", "caching": caching, "requests": n, "prompt_len": length, "device": device,
                "computed_tokens": st.computed_tokens - base[2], "hit_rate": round(hits / queries, 4),
                "batch_s": round(dt, 3)}
    finally:
        eng.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer and shorter prompts")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--out", default="results/bench/prefix_cache_bench.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    n_book, len_book = (64, 2048) if args.quick else (256, 8192)
    for caching in (False, True):
        rows.append(bookkeeping(caching, n_book, len_book, 32))
    from k2bench.engine.model.tiny import write_tiny_checkpoint

    n_eng, len_eng = (8, 256) if args.quick else (16, 1024)
    with tempfile.TemporaryDirectory() as tmp:
        d = write_tiny_checkpoint(Path(tmp) / "tiny", quant="mxfp4", seed=3)
        for caching in (False, True):
            rows.append(engine_run(d, caching, n_eng, len_eng, args.device, args.backend))
    cols = ["part", "caching", "requests", "prompt_len", "hit_rate", "admit_commit_us", "free_us",
            "computed_tokens", "batch_s"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.node(), "torch": torch.__version__,
                               "threads": torch.get_num_threads(), "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
