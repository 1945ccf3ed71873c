"""The fused glue kernels (RMSNorm + residual add; MLA's rope + latent norm + cache write) against the torch
reference: float32 against a float64 computation, bf16 within one rounding of the torch functions, the cache
written only at the step's slots, fp8 caches saturating. Under TRITON_INTERPRET=1 on CPU; the gpu test runs the
same cases compiled."""

from __future__ import annotations

import pytest
from kernel_cases import cuda_cases, interpreted_cases  # this folder

pytestmark = pytest.mark.engine

CASES = r'''
import torch
import torch.nn.functional as F
from k2bench.engine.kernels.torch_backend import TorchBackend
from k2bench.engine.kernels.triton_norm import mla_rope_cache, rms_norm, swiglu
from k2bench.engine.model.mxfp4 import fake_quantize_mxfp4
from k2bench.engine.model.config import RopeConfig
from k2bench.engine.model.layers import Rotary, rms_norm_reference

def ulps(got, ref):
    """Largest |got - ref| in units of the last place of ref (in ref's dtype) at ref's magnitude."""
    _, e = torch.frexp(ref.float().abs().clamp_min(torch.finfo(ref.dtype).tiny))
    spacing = torch.ldexp(torch.full_like(ref, torch.finfo(ref.dtype).eps, dtype=torch.float32), e - 1)
    return float(((got.float() - ref.float()).abs() / spacing).max())

def norm_cases(device):
    g = torch.Generator().manual_seed(3)
    res = {}
    x = torch.randn(9, 7168, generator=g) * 3
    w = torch.rand(7168, generator=g) + 0.5
    ref64 = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)) * w.double()
    got = rms_norm(x.to(device), w.to(device), 1e-6).cpu()
    res["f32_vs_f64_rel"] = float(((got.double() - ref64).abs() / ref64.abs().max()).max())
    xb, rb, wb = (t.to(torch.bfloat16).to(device) for t in (x, torch.randn(9, 7168, generator=g), w))
    y, h = rms_norm(xb, wb, 1e-6, rb)
    res["residual_sum_ulps"] = ulps(h, xb + rb)
    res["bf16_ulps"] = ulps(y, rms_norm_reference(h, wb, 1e-6))  # the norm of the sum the kernel kept
    kv = torch.randn(5, 576, generator=g).to(device)  # a strided slice, as kv_a_proj's latent half
    res["strided_f32_rel"] = float(((rms_norm(kv[:, :512], w[:512].to(device), 1e-6) -
                                     rms_norm_reference(kv[:, :512], w[:512].to(device), 1e-6)).abs().max()))
    res["empty_ok"] = rms_norm(xb[:0], wb, 1e-6).shape == (0, 7168)
    # the A4W4 input of the next GEMM in the same pass: the torch quantiser's values of the kernel's own norm
    yq, hq, q = rms_norm(xb, wb, 1e-6, rb, quantize=True)
    res["quant_same_norm"] = bool(torch.equal(yq, y) and torch.equal(hq, h))
    res["quant_bitequal"] = bool(torch.equal(q, fake_quantize_mxfp4(y)))
    x96 = (torch.randn(3, 96, generator=g) * 3).to(device)  # width not a power of two: a partial last block
    y96, _, q96 = rms_norm(x96, w[:96].to(device), 1e-6, torch.zeros_like(x96), quantize=True)
    res["quant_bitequal_96"] = bool(torch.equal(q96, fake_quantize_mxfp4(y96)))
    return res

def swiglu_cases(device):
    """silu(gate) * up against torch in each dtype, and its quantised form against the torch quantiser."""
    g = torch.Generator().manual_seed(6)
    res = {}
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(19, 2 * 160, generator=g) * 3).to(dtype).to(device)
        gate, up = x.chunk(2, dim=-1)
        ref = F.silu(gate) * up
        got = swiglu(x)
        q = swiglu(x, quantize=True)
        res[str(dtype)[6:]] = {"ulps": ulps(got, ref), "rel": float((got.float() - ref.float()).abs().max() / ref.float().abs().max()),
                               "dtype_ok": got.dtype == dtype and q.dtype == dtype and list(got.shape) == [19, 160],
                               "quant_bitequal": bool(torch.equal(q, fake_quantize_mxfp4(got)))}
    return res

def rope_cases(device):
    g = torch.Generator().manual_seed(4)
    res = {}
    T, H, nope, P, R, blocks, page = 6, 5, 16, 64, 512, 12, 4
    rope = RopeConfig(kind="yarn", theta=50000.0, factor=32.0, original_max_position_embeddings=4096,
                      beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
    ref_be = TorchBackend(device)
    pos = torch.tensor([0, 1, 17, 4095, 4096, 100000]).to(device)
    slots = torch.randperm(blocks * page, generator=g)[:T].to(device)
    for dtype in (torch.float32, torch.bfloat16):
        for cache_dtype in ((dtype, torch.float8_e4m3fn) if dtype == torch.bfloat16 else (dtype,)):
            for inter in (True, False):
                rot = Rotary(P, rope, inter)
                q = (torch.randn(T, H, nope + P, generator=g) * 2).to(dtype).to(device)
                kv = (torch.randn(T, R + P, generator=g) * 2).to(dtype).to(device)
                if cache_dtype == torch.float8_e4m3fn:
                    kv[0, :R] = 0.0
                    kv[0, 3] = 1.0  # the normed latent then holds sqrt(R) x w: w of 30 saturates past 448
                w = (torch.rand(R, generator=g) + 0.5).to(dtype).to(device)
                if cache_dtype == torch.float8_e4m3fn:
                    w[3] = 30.0
                base = torch.randn(blocks, page, R + P, generator=g).to(cache_dtype).to(device)
                c_ref, c_got = base.clone(), base.clone()
                q_ref, q_got = q.clone(), q.clone()
                qr = ref_be.mla_rope_cache(q_ref[..., nope:], kv, pos, rot, w, 1e-6, c_ref, slots)
                qg = mla_rope_cache(q_got[..., nope:], kv, pos, rot.inv_freq(pos.device), rot.mscale, inter, w, 1e-6,
                                    c_got, slots)
                key = f"{str(dtype)[6:]}_{str(cache_dtype)[6:]}_{'inter' if inter else 'halves'}"
                flat_g, flat_r, flat_b = (c.view(-1, R + P).float() for c in (c_got, c_ref, base))
                other = torch.ones(blocks * page, dtype=torch.bool, device=device)
                other[slots] = False
                res[key] = {
                    "q_in_place": qg.data_ptr() == q_got[..., nope:].data_ptr(),
                    "q_nope_untouched": bool(torch.equal(q_got[..., :nope], q[..., :nope])),
                    "q_pe_ulps": ulps(qg, qr),
                    "q_pe_rel": float((qg.float() - qr.float()).abs().max() / qr.float().abs().max()),
                    "cache_max_abs": float((flat_g[slots] - flat_r[slots]).abs().max()),
                    "cache_ref_scale": float(flat_r[slots].abs().max()),
                    "others_untouched": bool(torch.equal(flat_g[other], flat_b[other])),
                    "finite": bool(flat_g[slots].isfinite().all()),
                }
                if cache_dtype == torch.float8_e4m3fn:
                    res[key]["saturated"] = float(flat_g[slots[0], 3]) == 448.0
    return res

def compare(device):
    return {"norm": norm_cases(device), "swiglu": swiglu_cases(device), "rope": rope_cases(device)}
'''


def _check(res: dict, rounding_ulps: float) -> None:
    """rounding_ulps: how far one float32 -> bf16 cast may land from torch's round-to-nearest (0 on a GPU; the
    interpreter truncates, up to 1)."""
    norm = res["norm"]
    assert norm["f32_vs_f64_rel"] < 2e-6
    assert norm["residual_sum_ulps"] <= rounding_ulps and norm["empty_ok"]
    assert norm["bf16_ulps"] <= 1.0 + 2 * rounding_ulps  # one rounding apart (sum-of-squares order)
    assert norm["strided_f32_rel"] < 1e-5
    assert norm["quant_same_norm"] and norm["quant_bitequal"] and norm["quant_bitequal_96"]
    sw = res["swiglu"]
    assert sw["float32"]["rel"] < 1e-6  # sigmoid's last bits
    assert sw["bfloat16"]["ulps"] <= 1.0  # silu may round the other way, once
    assert all(r["dtype_ok"] and r["quant_bitequal"] for r in sw.values()), sw
    assert set(res["rope"]) == {"float32_float32_inter", "float32_float32_halves", "bfloat16_bfloat16_inter",
                                "bfloat16_bfloat16_halves", "bfloat16_float8_e4m3fn_inter",
                                "bfloat16_float8_e4m3fn_halves"}
    for key, r in res["rope"].items():
        assert r["q_in_place"] and r["q_nope_untouched"] and r["others_untouched"] and r["finite"], key
        if key.startswith("float32"):
            assert r["q_pe_rel"] < 1e-5, key  # cos / sin's last bits
        else:
            assert r["q_pe_ulps"] <= 1.0 + rounding_ulps, key
        # bf16 / fp8 entries: at most one rounding of the value apart; float32: cos/sin's last bits
        rel = {"float32": 1e-5, "bfloat16": 2**-7, "float8_e4m3fn": 2**-3}[key.split("_")[1]
                                                                            if "float8" not in key else "float8_e4m3fn"]
        assert r["cache_max_abs"] <= rel * r["cache_ref_scale"], key
        if "float8" in key:
            assert r["saturated"], key


def test_glue_kernels_under_interpreter():
    _check(interpreted_cases(CASES, "compare('cpu')"), rounding_ulps=1.0)


@pytest.mark.gpu
def test_glue_kernels_on_cuda():
    _check(cuda_cases(CASES, "compare"), rounding_ulps=0.0)
