"""The triton backend's MXFP4 GEMM (tl.dot_scaled) under TRITON_INTERPRET=1, against the torch reference.

Runs in a child process because the interpreter must be switched on before triton compiles anything.
W4 feeds bf16 activations, so its reference is the bf16-rounded activation times the dequantised
weight; A4W4 feeds FP4 on both sides, whose products are exact, so model logits match the torch
backend's A4W4 up to float32 summation order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

pytest.importorskip("triton")

CHILD = r"""
import json, sys, torch
from k2bench.engine.kernels.triton_backend import mxfp4_matmul
from k2bench.engine.kernels import get_backend
from k2bench.engine.model.loader import load_model
from k2bench.engine.model.mxfp4 import dequantize_mxfp4, fake_quantize_mxfp4, quantize_mxfp4
from k2bench.engine.model.tiny import TinySpec, write_tiny_checkpoint
from model_helpers import PagedDriver

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
out = {"gemm": []}
for m, n, k in [(1, 64, 32), (5, 48, 64), (33, 130, 96), (70, 256, 256)]:
    x = torch.randn(m, k, generator=g) * 3
    wp, ws = quantize_mxfp4(torch.randn(n, k, generator=g))
    wd = dequantize_mxfp4(wp, ws)
    ref_w4 = x.to(torch.bfloat16).float() @ wd.T
    ref_a4 = fake_quantize_mxfp4(x) @ wd.T
    w4 = mxfp4_matmul(x, wp, ws, a4w4=False)
    a4 = mxfp4_matmul(x, wp, ws, a4w4=True)
    out["gemm"].append({"shape": [m, n, k],
        "w4": float((w4 - ref_w4).abs().max() / ref_w4.abs().max()),
        "a4": float((a4 - ref_a4).abs().max() / ref_a4.abs().max())})
d = write_tiny_checkpoint(sys.argv[1], quant="mxfp4", seed=5, spec=TinySpec(layers=2))
prompts = [[5, 9, 40, 41, 42, 100, 7], [300, 301]]
res = {}
for backend in ("torch", "triton"):
    model, cfg = load_model(d, dtype="float32", backend=backend)
    res[backend] = {"logits": PagedDriver(model, cfg).prefill_all_logits(0, prompts[0]),
                    "tokens": PagedDriver(model, cfg, seed=3).greedy(prompts, 4), "mode": model.quant_mode}
out["model_logits_err"] = float((res["torch"]["logits"] - res["triton"]["logits"]).abs().max())
out["model_logits_scale"] = float(res["torch"]["logits"].abs().max())
out["tokens"] = [res["torch"]["tokens"], res["triton"]["tokens"]]
out["modes"] = [res["torch"]["mode"], res["triton"]["mode"]]
out["backend_name"] = get_backend("triton", "cpu").name
# W4: triton feeds bf16 activations; the like-for-like reference rounds them the same way
from model_helpers import bf16_activation_reference
w4 = {}
for backend in ("ref", "triton"):
    model, cfg = load_model(d, dtype="float32", backend="torch" if backend == "ref" else backend, quant_mode="w4")
    if backend == "ref":
        object.__setattr__(model.par, "backend", bf16_activation_reference())
    w4[backend] = PagedDriver(model, cfg).prefill_all_logits(0, prompts[0])
out["w4_err"] = float((w4["ref"] - w4["triton"]).abs().max())
out["w4_scale"] = float(w4["ref"].abs().max())
print("RESULT" + json.dumps(out))
"""


def test_triton_mxfp4_gemm_and_model_under_interpreter(tmp_path):
    here = Path(__file__).parents[1] / "model"  # the child imports model_helpers
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "tiny")], env=env, capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    out = json.loads(line[len("RESULT"):])
    for case in out["gemm"]:
        assert case["w4"] < 1e-5, case
        assert case["a4"] < 1e-5, case
    assert out["modes"] == ["a4w4", "a4w4"]
    assert out["backend_name"] == "triton"
    assert out["model_logits_err"] < 1e-4 * max(1.0, out["model_logits_scale"])
    assert out["tokens"][0] == out["tokens"][1]
    assert out["w4_err"] < 2e-3 * out["w4_scale"], out


SPLIT_CHILD = r"""
import json, torch
from k2bench.engine.kernels.triton_backend import gemm_split_k, mxfp4_matmul
from k2bench.engine.model.mxfp4 import dequantize_mxfp4, fake_quantize_mxfp4, quantize_mxfp4

torch.set_num_threads(1)
g = torch.Generator().manual_seed(1)
rows = []
# (lead dims of x, N, K, splits): K=1024 is 8 tiles of 128 (3 slices: 3+3+2, 5 -> 4 slices of 2; None is
# the automatic choice, 2 even slices there, so an explicit 2 would repeat it); K=320 is 5 tiles of 64
# (2: 3+2, 4 -> 3 slices: 2+2+1; None: whole)
for lead, n, k, splits in [((4,), 96, 1024, [1, 3, 5, 8, None]), ((2, 10), 64, 320, [2, 4, None])]:
    x = torch.randn(*lead, k, generator=g) * 3
    wp, ws = quantize_mxfp4(torch.randn(n, k, generator=g))
    wd = dequantize_mxfp4(wp, ws).double()
    for split in splits:
        used = split or gemm_split_k(x.numel() // k, n, k)
        for form in ("w4", "a4"):
            # the unsplit kernel casts to bf16 itself, which the interpreter truncates: float32 only
            for dtype in (torch.float32, torch.bfloat16) if used != 1 else (torch.float32,):
                xd = x.to(dtype)
                xr = fake_quantize_mxfp4(xd.float()) if form == "a4" else xd.to(torch.bfloat16)
                ref = xr.double() @ wd.T
                got = mxfp4_matmul(xd, wp, ws, a4w4=form == "a4", split_k=split)
                rows.append({"case": [list(lead), n, k, split, form, str(dtype)], "used": used,
                             "shape_ok": got.dtype == dtype and list(got.shape) == [*lead, n],
                             "err": float((got.double() - ref).abs().max()),
                             "err_bf16": float(((got.double() - ref).abs() - 2.0**-8 * ref.abs()).max()),
                             "scale": float(ref.abs().max())})
print("RESULT" + json.dumps(rows))
"""


def test_split_k_gemm_under_interpreter():
    """Split-K partial sums against float64: only float32 summation order differs from the whole-K
    loop, so float32 outputs stay within 1e-5 of the output scale; bf16 outputs add half an ulp of
    the one rounding to bf16 (2^-8 |ref|), which a truncating or twice-rounded store would exceed."""
    proc = subprocess.run([sys.executable, "-c", SPLIT_CHILD], env=dict(os.environ, TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))[len("RESULT"):])
    assert len(rows) == 4 * 4 + 2 + 2 * 4 + 2
    assert {r["used"] for r in rows if r["case"][3] is None} == {2, 1}  # auto: 8 tiles split, 5 not
    for r in rows:
        assert r["shape_ok"], r
        assert r["scale"] > 1.0, r
        if r["case"][-1] == "torch.float32":
            assert r["err"] <= 1e-5 * r["scale"], r
        else:
            assert r["err_bf16"] <= 1e-5 * r["scale"], r


def test_gemm_auto_split_heuristic():
    """Decode-sized M at Kimi widths gets enough K slices to fill an H200; prefill and short K stay whole."""
    from k2bench.engine.kernels.moe_dispatch import MIN_SPLIT_TILES, SPLIT_TARGET_PROGRAMS
    from k2bench.engine.kernels.triton_backend import gemm_split_k
    from k2bench.engine.kernels.triton_moe_glue import split_sizes

    for m, n, k in [(1, 18432, 7168), (4, 18432, 7168), (4, 7168, 9216), (64, 18432, 7168)]:
        split = gemm_split_k(m, n, k)
        slices, per = split_sizes(k, 128, split)
        programs = -(-m // 64) * (n // 64) * slices
        assert slices > 1 and per // 128 >= MIN_SPLIT_TILES, (m, n, k, split)
        assert programs >= SPLIT_TARGET_PROGRAMS * 0.8, (m, n, k, programs)
    assert gemm_split_k(4, 18432, 7168) == 4  # 288 tiles x 4 slices of 14 x 128
    assert gemm_split_k(128, 18432, 7168) == 1  # prefill-sized M: unchanged path
    assert gemm_split_k(4, 64, 256) == 1  # 2 K tiles: too short to split
    assert gemm_split_k(4, 64, 1024) == 2  # 8 tiles: two slices of the minimum length


def test_split_sizes_cover_k_in_whole_tiles():
    from k2bench.engine.kernels.triton_moe_glue import split_sizes

    for tiles in range(1, 40):
        for want in range(1, 50):
            slices, per = split_sizes(tiles * 64, 64, want)
            assert per % 64 == 0 and 1 <= slices <= min(want, tiles)
            assert (slices - 1) * per < tiles * 64 <= slices * per, (tiles, want)  # none empty, K covered


def test_triton_backend_refuses_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from k2bench.engine.kernels import BackendError, get_backend

    with pytest.raises(BackendError, match="TRITON_INTERPRET=1"):
        get_backend("triton", "cpu")


@pytest.mark.gpu
def test_triton_mxfp4_gemm_on_cuda():
    """For a GPU run (the lead's device runs): the compiled kernel against the torch reference."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from k2bench.engine.kernels.triton_backend import mxfp4_matmul
    from k2bench.engine.model.mxfp4 import dequantize_mxfp4, fake_quantize_mxfp4, quantize_mxfp4

    g = torch.Generator().manual_seed(0)
    # (1, 2048, 7168) splits K by default (14 slices); 1 forces the whole-K kernel, 5 an uneven split
    for m, n, k in [(1, 2048, 7168), (77, 7168, 2048), (256, 512, 1024)]:
        x = torch.randn(m, k, generator=g).cuda()
        wp, ws = (t.cuda() for t in quantize_mxfp4(torch.randn(n, k, generator=g)))
        wd = dequantize_mxfp4(wp, ws)
        ref = x.to(torch.bfloat16).float() @ wd.T
        ref4 = fake_quantize_mxfp4(x) @ wd.T
        for split in (None, 1, 5):
            y = mxfp4_matmul(x, wp, ws, a4w4=False, split_k=split)
            assert float((y - ref).abs().max() / ref.abs().max()) < 1e-4, (m, n, k, split)
            y4 = mxfp4_matmul(x, wp, ws, a4w4=True, split_k=split)
            assert float((y4 - ref4).abs().max() / ref4.abs().max()) < 1e-4, (m, n, k, split)


@pytest.mark.parametrize("n, ctx", [(9, 9), (40, 40), (5, 12), (14, 37), (1, 7), (6, 37)])
def test_expanded_prefill_equals_absorbed_attention(n, ctx):
    """The triton backend's prefill (expanded form, SDPA, lower-right causal) against the torch
    backend's absorbed attention over the same paged cache (float64 inputs). Chunks of at least a
    quarter of their context take the padded square call (queries at their positions among zero rows,
    64 rows in all here); shorter ones the lower-right mask: (1, 7) and (6, 37)."""
    import torch

    from k2bench.engine.kernels.torch_backend import TorchBackend
    from k2bench.engine.kernels.triton_backend import prefill_attention
    from k2bench.engine.model.attn_meta import AttentionMetadata

    g = torch.Generator().manual_seed(n * 100 + ctx)
    H, nope, rope, r, v, bs = 3, 8, 4, 16, 6, 4
    f64 = torch.float64
    cache = torch.randn(16, bs, r + rope, generator=g, dtype=f64)
    table = torch.tensor([[7, 2, 9, 4, 12, 0, 15, 3, 10, 1]])
    meta = AttentionMetadata(cu_seqlens_q=torch.tensor([0, n]), context_lens=torch.tensor([ctx]),
                             slot_mapping=torch.zeros(n, dtype=torch.long), block_tables=table, block_size=bs)
    q_nope = torch.randn(n, H, nope, generator=g, dtype=f64)
    q_pe = torch.randn(n, H, rope, generator=g, dtype=f64)
    w_uk = torch.randn(H, nope, r, generator=g, dtype=f64) / 4
    w_uv = torch.randn(H, v, r, generator=g, dtype=f64) / 4
    torch_b = TorchBackend()
    ref = torch_b.mla(q_nope, q_pe, cache, torch_b.plan_attention(meta, r + rope), 0.3, w_uk, w_uv)
    slots = (table[0].unsqueeze(1) * bs + torch.arange(bs)).reshape(-1)[:ctx]
    got = prefill_attention(q_nope, q_pe, cache.view(-1, r + rope)[slots], 0.3, w_uk, w_uv)
    assert got.shape == (n, H, v)
    assert float((got - ref).abs().max()) < 1e-6  # the torch backend's softmax runs in float32
    for path in ("square", "lower_right"):  # either way through SDPA, whichever chunk_path picks
        other = prefill_attention(q_nope, q_pe, cache.view(-1, r + rope)[slots], 0.3, w_uk, w_uv, path=path)
        assert float((other - ref).abs().max()) < 1e-6, path
    # the causal mask is live: the first chunk row must not see the chunk's later keys
    if n > 1:
        kv = cache.view(-1, r + rope)[slots]
        seen = prefill_attention(q_nope[:1], q_pe[:1], kv[: ctx - n + 1], 0.3, w_uk, w_uv)
        assert float((seen[0] - got[0]).abs().max()) < 1e-10
        peek = prefill_attention(q_nope[:1], q_pe[:1], kv, 0.3, w_uk, w_uv)  # one query over all keys
        assert float((peek[0] - got[0]).abs().max()) > 1e-3


def test_query_bucket_rounds_up_by_at_most_an_eighth():
    from k2bench.engine.kernels.triton_backend import query_bucket

    sizes = range(1, 20000)
    buckets = [query_bucket(n) for n in sizes]
    assert all(b >= n and b % 64 == 0 for n, b in zip(sizes, buckets, strict=True))
    assert all(b - n <= max(63, n // 8) for n, b in zip(sizes, buckets, strict=True))
    # the design card's chunk lengths (8192 less up to 127 decodes) share one shape
    assert {query_bucket(n) for n in range(8192 - 127, 8193)} == {8192}


def test_prefill_buckets_are_every_length_the_square_calls_meet():
    """The engine's warm-up runs `prefill_buckets(max_ctx)`: every padded length a context up to max_ctx
    gives, and nothing past the last one it needs."""
    from k2bench.engine.kernels.triton_backend import prefill_buckets, query_bucket

    for max_ctx in (1, 64, 65, 1000, 9600, 32768):
        buckets = prefill_buckets(max_ctx)
        assert buckets == sorted(set(buckets))
        assert set(buckets) == {query_bucket(n) for n in range(1, max_ctx + 1)}
    assert len(prefill_buckets(32768)) < 64  # a second or two of cuDNN plan builds at start, not minutes


@pytest.mark.parametrize("a4w4", [False, True])
def test_dequant_linear_feeds_the_kernels_operands(a4w4):
    """The prefill-sized path (dequantise + BLAS) computes what `mxfp4_matmul` computes on a GPU without
    FP4 units: bf16-rounded (A4W4: quantise-dequantised) activations times the exact weights, summed in
    float32 for float32 inputs. Float64 reference from the independent E2M1 table decode."""
    import torch

    from k2bench.engine.kernels.triton_backend import dequant_linear
    from k2bench.engine.model.mxfp4 import fake_quantize_mxfp4, quantize_mxfp4

    e2m1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6]  # OCP MX spec; codes 8..15 are the negatives

    g = torch.Generator().manual_seed(7 + a4w4)
    x = torch.randn(40, 96, generator=g)
    wp, ws = quantize_mxfp4(torch.randn(24, 96, generator=g))
    codes = torch.stack((wp & 0xF, wp >> 4), dim=-1).reshape(24, 96).long()  # low nibble first
    w = torch.tensor(e2m1 + [-v for v in e2m1], dtype=torch.float64)[codes] * torch.exp2(ws.double() - 127).repeat_interleave(32, -1)
    xin = fake_quantize_mxfp4(x) if a4w4 else x
    ref = xin.to(torch.bfloat16).double() @ w.T
    got = dequant_linear(x, wp, ws, a4w4=a4w4)
    assert got.dtype == torch.float32
    assert float((got.double() - ref).abs().max() / ref.abs().max()) < 1e-6
    x16 = x.to(torch.bfloat16)  # bf16 activations: quantised from their bf16 values, output rounded to bf16
    ref16 = (fake_quantize_mxfp4(x16) if a4w4 else x16).double() @ w.T
    got16 = dequant_linear(x16, wp, ws, a4w4=a4w4)
    assert got16.dtype == torch.bfloat16
    assert float((got16.double() - ref16).abs().max() / ref16.abs().max()) < 1e-2
