"""The prefill pieces of the triton backend at Kimi-K2.5 width, timed alone on one GPU.

- MLA prefill attention (`triton_backend.prefill_attention`: expanded form, H=64 heads, head dims
  192/128, causal) at 8192 tokens under each fused SDPA kernel that accepts its shapes, next to the
  former call (3-D tensors, values zero-padded to 192: the math kernel); TFLOP/s counts the causal
  half of QK^T and PV.
- Prefill chunks with context (--chunks n x ctx: n queries after ctx - n cached tokens, the shapes a
  step budget cuts a prompt into) both ways `prefill_attention` can take them: the padded square call,
  and the lower-right mask on the flash kernel (values padded) or on the memory-efficient kernel (values
  unpadded: the engine's call before 2026-12-03). TFLOP/s counts what the queries see. Sets
  `SQUARE_MIN_SHARE`, the chunk share of its context from which the square call is cheaper.
- Dense MXFP4 linears (the dense MLP's and shared expert's shapes) per row count M: `_mxfp4_gemm`
  (dot_scaled) against `dequant_linear` (dequantise to bf16 + cuBLAS), which sets DEQUANT_MIN_M.

Each variant is checked against a float64 reference (rel = max |diff| / max |ref|). Medians of
CUDA-event timings. Writes prefill_bench.json.

    python bench/engine_prefill_bench.py --out /tmp/out [--chunks 256x8192,2048x8192]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from k2bench.engine.kernels.triton_backend import chunk_path, dequant_linear, mxfp4_matmul, prefill_attention
from k2bench.engine.model.mxfp4 import dequantize_mxfp4, quantize_mxfp4

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_gpu_bench import cuda_time_ms  # noqa: E402

H, NOPE, ROPE, R, V = 64, 128, 64, 512, 128


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).abs().max() / b.abs().max())


def former_prefill_attention(q_nope, q_pe, kv, scale, w_uk, w_uv):
    """The call this bench replaced, for comparison: 3-D tensors and V padded to the key width."""
    n, h, _ = q_nope.shape
    ctx = kv.shape[0]
    latent, k_pe = kv[:, :R], kv[:, R:]
    k = torch.cat((torch.einsum("cr,hdr->hcd", latent, w_uk), k_pe.unsqueeze(0).expand(h, ctx, -1)), dim=-1)
    v = F.pad(torch.einsum("cr,hvr->hcv", latent, w_uv), (0, NOPE + ROPE - V))
    q = torch.cat((q_nope, q_pe), dim=-1).transpose(0, 1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)[..., :V].transpose(0, 1)


def _inputs(n: int, ctx: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Random bf16 q_nope, q_pe (n queries), cached latents kv (ctx keys) and kv_b_proj's halves w_uk, w_uv."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    return (torch.randn(n, H, NOPE, generator=g, **bf), torch.randn(n, H, ROPE, generator=g, **bf),
            torch.randn(ctx, R + ROPE, generator=g, **bf), torch.randn(H, NOPE, R, generator=g, **bf) / R**0.5,
            torch.randn(H, V, R, generator=g, **bf) / R**0.5)


def attention_rows(n: int, reps: int) -> list[dict]:
    q_nope, q_pe, kv, w_uk, w_uv = _inputs(n, n, n)
    scale = (NOPE + ROPE) ** -0.5
    sub = slice(0, 256)  # a float64 reference on the first 256 query rows (the causal ones see <= 256 keys)
    ref = prefill_attention(*(t.double() for t in (q_nope[sub], q_pe[sub], kv[sub])), scale,
                            w_uk.double(), w_uv.double())
    flops = 2 * H * n * n * (NOPE + ROPE + V) / 2
    rows = []
    cases = [("former 3-D, V padded", None, former_prefill_attention)]
    cases += [(f"4-D {b.name}", b, prefill_attention) for b in
              (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)]
    cases.append(("4-D default dispatch", "default", prefill_attention))
    for name, backend, fn in cases:
        def call(fn=fn, backend=backend):
            if backend in (None, "default"):
                return fn(q_nope, q_pe, kv, scale, w_uk, w_uv)
            with sdpa_kernel([backend]):
                return fn(q_nope, q_pe, kv, scale, w_uk, w_uv)
        try:
            out = call()
            med, _ = cuda_time_ms(call, reps)
        except RuntimeError as exc:
            rows.append({"kernel": "prefill_attention", "variant": name, "n": n, "error": str(exc).splitlines()[0]})
            print(f"attention n={n} {name:<26} not taken: {str(exc).splitlines()[0][:90]}", flush=True)
            continue
        rel = _rel(out[sub], ref)
        rows.append({"kernel": "prefill_attention", "variant": name, "n": n, "ms": med,
                     "tflops": flops / med / 1e9, "rel_err_f64": rel})
        print(f"attention n={n} {name:<26} {med:8.2f} ms  {flops / med / 1e9:6.0f} TFLOP/s  rel {rel:.1e}", flush=True)
    return rows


def unpadded_lower_right(q_nope, q_pe, kv, scale, w_uk, w_uv):
    """The lower-right call as the engine made it before 2026-12-03: values at their own width, which only
    the memory-efficient kernel takes with that mask."""
    n, h, _ = q_nope.shape
    ctx = kv.shape[0]
    latent, k_pe = kv[:, :R], kv[:, R:]
    k = torch.cat((torch.einsum("cr,hdr->hcd", latent, w_uk), k_pe.unsqueeze(0).expand(h, ctx, -1)), dim=-1)
    v = torch.einsum("cr,hvr->hcv", latent, w_uv)
    q = torch.cat((q_nope, q_pe), dim=-1).transpose(0, 1)
    o = F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                       attn_mask=causal_lower_right(n, ctx), scale=scale)
    return o[0].transpose(0, 1)


def chunk_rows(shapes: list[tuple[int, int]], reps: int) -> list[dict]:
    rows = []
    scale = (NOPE + ROPE) ** -0.5
    for n, ctx in shapes:
        q_nope, q_pe, kv, w_uk, w_uv = _inputs(n, ctx, n + ctx)
        # float64 reference for the chunk's first 64 queries (they see the first ctx - n + 64 keys)
        sub, seen = slice(0, min(n, 64)), ctx - n + min(n, 64)
        ref = prefill_attention(*(t.double() for t in (q_nope[sub], q_pe[sub], kv[:seen])), scale,
                                w_uk.double(), w_uv.double(), path="lower_right")
        visible = n * (ctx - n) + n * (n + 1) // 2
        flops = 2 * H * visible * (NOPE + ROPE + V)
        args = (q_nope, q_pe, kv, scale, w_uk, w_uv)
        cases = [("square (default dispatch)", functools.partial(prefill_attention, *args, path="square")),
                 ("lower_right flash, V padded", functools.partial(_on, SDPBackend.FLASH_ATTENTION, prefill_attention,
                                                                   *args, path="lower_right")),
                 ("lower_right efficient, V unpadded", functools.partial(_on, SDPBackend.EFFICIENT_ATTENTION,
                                                                         unpadded_lower_right, *args))]
        for name, call in cases:
            try:
                out = call()
                med, _ = cuda_time_ms(call, reps)
            except RuntimeError as exc:
                rows.append({"kernel": "chunk_attention", "variant": name, "n": n, "ctx": ctx,
                             "error": str(exc).splitlines()[0]})
                print(f"chunk {n:>5} x {ctx:<5} {name:<34} not taken: {str(exc).splitlines()[0][:80]}", flush=True)
                continue
            rel = _rel(out[sub], ref)
            rows.append({"kernel": "chunk_attention", "variant": name, "n": n, "ctx": ctx, "ms": med,
                         "tflops": flops / med / 1e9, "rel_err_f64": rel, "default_path": chunk_path(n, ctx)})
            print(f"chunk {n:>5} x {ctx:<5} {name:<34} {med:8.3f} ms {flops / med / 1e9:6.0f} TFLOP/s rel {rel:.1e}"
                  f"  (default: {chunk_path(n, ctx)})", flush=True)
    return rows


def _on(backend, fn, *args, **kw):
    with sdpa_kernel([backend]):
        return fn(*args, **kw)


def dense_rows(ms: list[int], reps: int) -> list[dict]:
    rows = []
    g = torch.Generator(device="cuda").manual_seed(1)
    for n, k in [(18432, 7168), (7168, 18432), (4096, 7168)]:
        wp, ws = quantize_mxfp4(torch.randn(n, k, device="cuda", generator=g))
        wd = dequantize_mxfp4(wp, ws, torch.float64)
        for m in ms:
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.double() @ wd.T
            for name, op in [("dot_scaled kernel", mxfp4_matmul), ("dequant + cuBLAS", dequant_linear)]:
                fn = functools.partial(op, x, wp, ws, a4w4=False)
                rel = _rel(fn(), ref)
                med, _ = cuda_time_ms(fn, reps)
                tflops = 2 * m * n * k / med / 1e9
                rows.append({"kernel": "dense_mxfp4", "variant": name, "m": m, "n": n, "k": k, "ms": med,
                             "tflops": tflops, "rel_err_f64": rel})
                print(f"dense M={m:>5} N={n:>5} K={k:>5} {name:<18} {med:8.3f} ms {tflops:6.0f} TFLOP/s rel {rel:.1e}",
                      flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--dense-m", default="32,128,256,512,2048,8192")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--chunks", default="", help="n x ctx list (e.g. 256x8192,2048x8192): only these chunk shapes")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.chunks:
        try:
            shapes = [tuple(int(x) for x in c.split("x")) for c in args.chunks.split(",")]
        except ValueError:
            ap.error(f"--chunks takes n x ctx pairs such as 256x8192, got {args.chunks!r}")
        if any(len(sh) != 2 or not 0 < sh[0] <= sh[1] for sh in shapes):
            ap.error("--chunks: each pair needs 0 < n <= ctx")
        rows = chunk_rows(shapes, args.reps)
    else:
        rows = attention_rows(args.tokens, args.reps)
        rows += dense_rows([int(m) for m in args.dense_m.split(",")], args.reps)
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    (args.out / "prefill_bench.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
