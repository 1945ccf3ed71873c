"""GPU check of the bundled engine: greedy tokens on CUDA (torch backend) against the CPU run.

Writes the tiny checkpoints, runs the whole runtime (scheduler, paged cache, chunked prefill,
batching, preemption) through LLMEngine on CPU and on CUDA in float32, compares the greedy
tokens, then does the same through `k2bench serve --device cuda` over HTTP, and times a
batched decode on CUDA. Prints a table and writes engine_gpu_check.json to --out (or $OUT).

    python bench/engine_gpu_check.py --out /tmp/gpucheck
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

from k2bench.engine.model.tiny import write_tiny_checkpoint
from k2bench.engine.runtime.build import EngineOptions, build_engine
from k2bench.engine.runtime.runtime_config import RuntimeConfig
from k2bench.engine.runtime.sequence import SamplingParams, Sequence
from k2bench.net import free_port

LENGTHS = [5, 17, 64, 300, 1000, 2]
MAX_TOKENS = 32


def prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(10, vocab - 10, (n,), generator=g).tolist() for n in LENGTHS]


def generate(model: Path, device: str, dtype: str, kv: str = "auto", num_kv_blocks: int = 1024,
             ps: list[list[int]] | None = None) -> dict:
    max_len = 2048 if num_kv_blocks * 16 >= 2048 else num_kv_blocks * 16
    rt = RuntimeConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=max_len, block_size=16,
                       num_kv_blocks=num_kv_blocks, kv_cache_dtype=kv)
    eng = build_engine(EngineOptions(model=str(model), device=device, dtype=dtype, backend="torch", runtime=rt))
    seqs = [Sequence(p, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)) for p in ps]
    t0 = time.perf_counter()
    eng.generate(seqs)
    if device == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return {"tokens": [s.output_token_ids for s in seqs], "seconds": round(dt, 3), "steps": eng.stats.steps,
            "preemptions": eng.scheduler.num_preemptions}


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of positions equal up to the first divergence of each sequence."""
    same = total = 0
    for x, y in zip(a, b, strict=True):
        total += len(x)
        for u, v in zip(x, y, strict=True):
            if u != v:
                break
            same += 1
    return same / total


def via_server(model: Path, device: str, ps: list[list[int]]) -> dict:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "k2bench.harness.cli", "serve", "--model", str(model),
                             "--port", str(port), "--device", device, "--dtype", "float32", "--backend", "torch",
                             "--max-model-len", "2048", "--num-kv-blocks", "1024", "--block-size", "16"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError("server exited: " + proc.stdout.read()[-2000:])
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("server did not start") from None
                time.sleep(0.5)
        out = []
        t0 = time.perf_counter()
        for p in ps:
            body = json.dumps({"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
                               "stream": True, "stream_options": {"include_usage": True}}).encode()
            req = urllib.request.Request(url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            ids, usage = [], None
            with urllib.request.urlopen(req, timeout=120) as r:
                for line in r:
                    line = line.strip()
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    msg = json.loads(line[6:])
                    if msg.get("choices"):
                        ids.extend(msg["choices"][0].get("token_ids") or [])
                    if msg.get("usage"):
                        usage = msg["usage"]
            if not usage or usage["completion_tokens"] != len(ids):
                raise RuntimeError(f"usage {usage} does not match {len(ids)} streamed tokens")
            out.append(ids)
        return {"tokens": out, "seconds": round(time.perf_counter() - t0, 3)}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def decode_speed(model: Path, device: str, batch: int, ctx: int, steps: int) -> dict:
    rt = RuntimeConfig(max_num_seqs=batch, max_num_batched_tokens=16384, max_model_len=ctx + steps + 8,
                       block_size=16)
    eng = build_engine(EngineOptions(model=str(model), device=device, dtype="bfloat16", backend="torch", runtime=rt))
    g = torch.Generator().manual_seed(0)
    seqs = [Sequence(torch.randint(10, 400, (ctx,), generator=g).tolist(),
                     SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)) for _ in range(batch)]
    for s in seqs:
        eng.add(s)
    t0 = time.perf_counter()
    while any(s.num_output_tokens == 0 for s in seqs):
        eng.step()
    if device == "cuda":
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    for _ in range(steps):
        eng.step()
    if device == "cuda":
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    return {"batch": batch, "ctx": ctx, "prefill_tok_s": round(batch * ctx / (t1 - t0)),
            "decode_ms_per_step": round((t2 - t1) / steps * 1000, 2), "decode_tok_s": round(batch * steps / (t2 - t1))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or ".")
    ap.add_argument("--skip-server", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    info = {"torch": torch.__version__, "python": platform.python_version(), "cuda_available": cuda,
            "gpu": torch.cuda.get_device_name(0) if cuda else None, "compared_device": dev}
    print(json.dumps(info))
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        ckpts = {q: write_tiny_checkpoint(Path(tmp) / q, quant=q, seed=0) for q in ("mxfp4", "bf16")}
        vocab = json.loads((ckpts["mxfp4"] / "config.json").read_text()).get("vocab_size", 512)
        ps = prompts(vocab)
        for q, model in ckpts.items():
            ref = generate(model, "cpu", "float32", ps=ps)
            rows.append({"case": f"{q} cpu float32 (reference)", **{k: v for k, v in ref.items() if k != "tokens"},
                         "match": "-"})
            cases = [(f"{q} {dev} float32", dict(device=dev, dtype="float32")),
                     (f"{q} {dev} float32, 90 KV blocks (preemption)", dict(device=dev, dtype="float32",
                                                                            num_kv_blocks=90))]
            for name, kw in cases:
                r = generate(model, ps=ps, **kw)
                exact = r["tokens"] == ref["tokens"]
                ok &= exact
                rows.append({"case": name, **{k: v for k, v in r.items() if k != "tokens"},
                             "match": "exact" if exact else f"DIFFERENT ({agreement(ref['tokens'], r['tokens']):.2%})"})
            if q == "mxfp4":
                r = generate(model, dev, "bfloat16", kv="fp8", ps=ps)
                rows.append({"case": f"{q} {dev} bfloat16 + fp8 KV (informational)",
                             **{k: v for k, v in r.items() if k != "tokens"},
                             "match": f"{agreement(ref['tokens'], r['tokens']):.2%} of tokens before divergence"})
                if not args.skip_server:
                    r = via_server(model, dev, ps)
                    exact = r["tokens"] == ref["tokens"]
                    ok &= exact
                    rows.append({"case": f"{q} k2bench serve --device {dev} (HTTP, streamed token_ids)",
                                 "seconds": r["seconds"], "steps": "-", "preemptions": "-",
                                 "match": "exact" if exact else f"DIFFERENT ({agreement(ref['tokens'], r['tokens']):.2%})"})
    print(f"\n{'case':58} {'seconds':>8} {'steps':>6} {'preempt':>7}  match")
    for r in rows:
        print(f"{r['case']:58} {r['seconds']:>8} {r['steps']:>6} {r['preemptions']:>7}  {r['match']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"info": info, "rows": rows, "decode": [], "all_exact": ok}
    (out / "engine_gpu_check.json").write_text(json.dumps(result, indent=2))
    if cuda and not args.skip_speed:
        with tempfile.TemporaryDirectory() as tmp:
            model = write_tiny_checkpoint(Path(tmp) / "mxfp4", quant="mxfp4", seed=0)
            print(f"\n{'decode on ' + dev:20} {'batch':>6} {'ctx':>6} {'prefill tok/s':>14} {'ms/step':>8} {'tok/s':>8}")
            for b, c in ((1, 1024), (64, 1024), (128, 8192)):
                sp = decode_speed(model, dev, b, c, 32)
                result["decode"].append(sp)
                (out / "engine_gpu_check.json").write_text(json.dumps(result, indent=2))
                print(f"{'mxfp4 bf16 torch':20} {b:>6} {c:>6} {sp['prefill_tok_s']:>14} "
                      f"{sp['decode_ms_per_step']:>8} {sp['decode_tok_s']:>8}", flush=True)
    print(f"\nall exact: {ok}; wrote {out / 'engine_gpu_check.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
