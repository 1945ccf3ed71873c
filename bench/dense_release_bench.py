"""Dense MLPs held once: one dense MLP on the triton backend's fast variant with its checkpoint tensors
released at load (the fast copy alone) against kept (K2BENCH_KEEP_DENSE_CHECKPOINT=1: the copy is built on the
first decode, beside them, as before the release existed).

(a) bytes after load and `prepare`, after the first decode step, and the peak of a prefill batch (the
    allocator's figures on a GPU, parameter plus backend-copy bytes everywhere);
(b) time: a prefill batch of 8192 rows through the released MLP (its fast copy decoded back to checkpoint
    bytes, then `dequant_linear`) against `dequant_linear` on the checkpoint tensors (what the kept MLP runs
    on Hopper), outputs compared bit for bit; decode batches of 4/32/128 rows, released against kept (the
    same one-expert fast MoE, so the times should agree).
Times are medians of CUDA-event timings (perf_counter on CPU). Kimi-K2.5 width: H=7168, inter 18432 (the dense
layer's MLP) and 2048 (a shared expert), random MXFP4 weights, bf16 activations in A4W4.

    python bench/dense_release_bench.py --out /tmp/dense                                  # one H200
    TRITON_INTERPRET=1 python bench/dense_release_bench.py --tiny --out /tmp/dense        # the CPU check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_gpu_bench import cuda_time_ms  # noqa: E402

from k2bench.engine.kernels import get_backend
from k2bench.engine.kernels.triton_backend import dequant_linear
from k2bench.engine.model.config import QuantConfig
from k2bench.engine.model.moe import KEEP_DENSE_ENV, DenseMLP
from k2bench.engine.model.parallel import Parallel

MIB = 2**20


def build(hidden: int, inter: int, device: torch.device, release: bool) -> DenseMLP:
    """One dense MLP with random MXFP4 weights (the same for a given inter), prepared as the loader does."""
    backend = get_backend("triton", device.type)
    backend.moe_variant = "fast"  # the H200's choice; named so the CPU check takes the same path
    par = Parallel(dtype=torch.bfloat16, a4w4=True, backend=backend)
    cfg = SimpleNamespace(hidden_size=hidden, quant=QuantConfig())  # all that DenseMLP reads of a config
    with torch.device(device):
        mlp = DenseMLP(cfg, par, "mlp", inter, reduce=False)
    g = torch.Generator(device).manual_seed(inter)
    for lin in (mlp.gate_up, mlp.down):
        lin.weight.random_(0, 256, generator=g)
        lin.weight_scale.random_(118, 122, generator=g)  # values about 2^-9..2^-6 x E2M1, as trained weights
    os.environ.pop(KEEP_DENSE_ENV, None) if release else os.environ.update({KEEP_DENSE_ENV: "1"})
    mlp.prepare()
    os.environ.pop(KEEP_DENSE_ENV, None)
    return mlp


def held(mlp: DenseMLP) -> int:
    """Bytes of the MLP's parameters plus the backend's copy of them."""
    n = sum(p.numel() * p.element_size() for p in mlp.parameters())
    for _ref, fast in mlp.par.backend._dense.values():
        n += sum(t.numel() * t.element_size() for t in (fast.w13, fast.s13, fast.w2, fast.s2)) if fast else 0
    return n


def memory_row(hidden: int, inter: int, device: torch.device, release: bool, prefill: int) -> dict:
    cuda = device.type == "cuda"
    alloc = (lambda: torch.cuda.memory_allocated(device)) if cuda else (lambda: 0)
    base = alloc()
    mlp = build(hidden, inter, device, release)
    row = {"inter": inter, "release": release, "loaded_bytes": held(mlp), "loaded_alloc": alloc() - base}
    mlp(torch.randn(4, hidden, dtype=torch.bfloat16, device=device))
    row.update(after_decode_bytes=held(mlp), after_decode_alloc=alloc() - base)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    mlp(torch.randn(prefill, hidden, dtype=torch.bfloat16, device=device))
    row["prefill_peak_alloc"] = torch.cuda.max_memory_allocated(device) - base if cuda else None
    return row


def median_ms(fn, reps: int, cuda: bool) -> float:
    """The GPU benches' event timer (`engine_gpu_bench.cuda_time_ms`) on a GPU; perf_counter on CPU."""
    if cuda:
        return cuda_time_ms(fn, reps, warmup=1)[0]
    fn()  # compiles
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def checkpoint_path(mlp: DenseMLP, x: torch.Tensor) -> torch.Tensor:
    """The kept MLP's prefill on a GPU without FP4 units: dequant_linear, SwiGLU + quantiser, dequant_linear."""
    gu, down = mlp.gate_up, mlp.down
    h = mlp.par.backend.swiglu(dequant_linear(x, gu.weight, gu.weight_scale, a4w4=True), True)
    return dequant_linear(h, down.weight, down.weight_scale, a4w4=True, x_quantized=True)


def timings(hidden: int, inter: int, device: torch.device, prefill: int, reps: int) -> tuple[dict, list[dict]]:
    """(b): the prefill batch and the decode batches, released against the checkpoint tensors."""
    cuda = device.type == "cuda"
    kept, released = build(hidden, inter, device, False), build(hidden, inter, device, True)
    x = torch.randn(prefill, hidden, dtype=torch.bfloat16, device=device, generator=torch.Generator(device).manual_seed(0))
    pre = {"inter": inter, "rows": prefill, "bit_identical": bool(torch.equal(released(x), checkpoint_path(kept, x))),
           "before_ms": median_ms(lambda: checkpoint_path(kept, x), reps, cuda),
           "released_ms": median_ms(lambda: released(x), reps, cuda)}
    dec = []
    for xd in (x[:rows].clone() for rows in (4, 32, 128)):
        dec.append({"inter": inter, "rows": xd.shape[0], "bit_identical": bool(torch.equal(released(xd), kept(xd))),
                    "before_ms": median_ms(lambda xd=xd: kept(xd), reps * (5 if cuda else 1), cuda),
                    "released_ms": median_ms(lambda xd=xd: released(xd), reps * (5 if cuda else 1), cuda)})
    return pre, dec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiny", action="store_true", help="small shapes on CPU (needs TRITON_INTERPRET=1)")
    ap.add_argument("--reps", type=int, default=None, help="timed prefill runs (default 20, tiny 1); decode 5x")
    args = ap.parse_args()
    if args.tiny and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--tiny runs the Triton kernels on CPU: set TRITON_INTERPRET=1")
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU, or with --tiny under TRITON_INTERPRET=1")
    device = torch.device("cpu" if args.tiny else "cuda")
    cuda = device.type == "cuda"
    hidden, inters, prefill = (128, (256, 64), 1024) if args.tiny else (7168, (18432, 2048), 8192)
    reps = args.reps or (1 if args.tiny else 20)
    doc = {"device": torch.cuda.get_device_name(device) if cuda else "cpu (TRITON_INTERPRET=1)", "hidden": hidden,
           "prefill_rows": prefill, "reps": reps, "memory": [], "prefill": [], "decode": []}
    for inter in inters:
        for release in (False, True):
            doc["memory"].append(memory_row(hidden, inter, device, release, prefill))
        pre, dec = timings(hidden, inter, device, prefill, reps)
        doc["prefill"].append(pre)
        doc["decode"] += dec
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dense_release.json").write_text(json.dumps(doc, indent=1))
    print(f"{doc['device']}, H={hidden}, A4W4 bf16; MiB (allocator figures on a GPU, else parameter + copy bytes)")
    print(f"{'inter':>6} {'release':>8} {'loaded':>8} {'+decode':>8} {'prefill peak':>13}")
    for m in doc["memory"]:
        kind = "alloc" if cuda else "bytes"
        peak = f"{m['prefill_peak_alloc'] / MIB:13.3f}" if cuda else f"{'-':>13}"
        print(f"{m['inter']:>6} {'on' if m['release'] else 'off':>8} {m['loaded_' + kind] / MIB:8.3f} "
              f"{m['after_decode_' + kind] / MIB:8.3f} {peak}")
    print(f"\n{'inter':>6} {'rows':>5} {'before ms':>10} {'released ms':>12} {'ratio':>6} {'bit-identical':>14}")
    for r in doc["prefill"] + doc["decode"]:
        print(f"{r['inter']:>6} {r['rows']:>5} {r['before_ms']:10.3f} {r['released_ms']:12.3f} "
              f"{r['released_ms'] / r['before_ms']:6.2f} {str(r['bit_identical']):>14}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
