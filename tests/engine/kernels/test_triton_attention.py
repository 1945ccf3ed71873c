"""The Triton paged MLA decode kernel (engine/kernels/triton_attention.py) under TRITON_INTERPRET=1.

Runs in a child process because the interpreter must be switched on before triton compiles anything.
Each case builds a paged cache with shuffled, non-contiguous block tables padded with block 0, and
compares the kernel with
- a float64 reference written here: per sequence, its blocks one by one, the stored cache values
  upcast (so an fp8 cache is judged against the fp8 values it holds), an explicit softmax;
- the torch backend's decode path (`plan_attention` + `mla_attention`) on the same cache.
The kernel runs on a poisoned copy of the cache: block 0 (where table padding points) and the unused
tail of every sequence's last block hold NaN, so any read outside a context shows up as NaN.
(The torch backend multiplies gathered padding by zero probabilities, so it gets the clean cache.)

Tolerances, relative to the largest |output| of the case:
- float32 query and cache: 1e-5 against both references (float32 accumulation order only);
- bf16 query (bf16, fp8 or float32 cache): 2e-2 against float64 (the kernel rounds the cache
  and probabilities to bf16 as the torch backend does, and returns bf16: ~3 significant digits) and
  3e-2 against the torch backend (which also rounds its scores to bf16 before the softmax).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

pytest.importorskip("triton")

CHILD = r"""
import json, random, torch
from k2bench.engine.model.attn_meta import AttentionMetadata
from k2bench.engine.kernels.torch_backend import TorchBackend
from k2bench.engine.kernels.triton_attention import mla_decode

torch.set_num_threads(1)
R, P = 64, 16
SCALE = 0.3


def reference(q_lat, q_pe, cache, tables, lens):
    B, H, r = q_lat.shape
    bs = cache.shape[1]
    out = torch.empty(B, H, r, dtype=torch.float64)
    for b in range(B):
        rows = []
        for i in range(-(-int(lens[b]) // bs)):
            rows.append(cache[int(tables[b, i])].to(torch.float64))
        kv = torch.cat(rows)[: int(lens[b])]
        s = (q_lat[b].double() @ kv[:, :r].T + q_pe[b].double() @ kv[:, r:].T) * SCALE
        w = torch.exp(s - s.max(dim=-1, keepdim=True).values)
        out[b] = (w / w.sum(dim=-1, keepdim=True)) @ kv[:, :r]
    return out


def make_case(seed, lens, H, bs, cache_dtype, q_dtype):
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // bs) for n in lens]
    num_blocks = 1 + sum(need) + 3  # block 0 is only ever padding; a few blocks stay unused
    ids = list(range(1, num_blocks))
    random.Random(seed).shuffle(ids)
    width = max(need) + 2  # extra padding columns beyond every sequence's blocks
    tables = torch.zeros(len(lens), width, dtype=torch.long)
    for b, n in enumerate(need):
        tables[b, :n] = torch.tensor([ids.pop() for _ in range(n)])
    clean = torch.randn(num_blocks, bs, R + P, generator=g).to(cache_dtype)
    poisoned = clean.clone()
    poisoned[0] = float("nan")
    for b, n in enumerate(lens):
        poisoned[int(tables[b, need[b] - 1]), n - (need[b] - 1) * bs:] = float("nan")
    q_lat = torch.randn(len(lens), H, R, generator=g).to(q_dtype)
    q_pe = torch.randn(len(lens), H, P, generator=g).to(q_dtype)
    return q_lat, q_pe, clean, poisoned, tables, torch.tensor(lens, dtype=torch.long)


def torch_backend(q_lat, q_pe, cache, tables, lens):
    B = len(lens)
    bs = cache.shape[1]
    meta = AttentionMetadata(
        cu_seqlens_q=torch.arange(B + 1, dtype=torch.int32), context_lens=lens,
        slot_mapping=tables[torch.arange(B), (lens - 1) // bs] * bs + (lens - 1) % bs,
        block_tables=tables, block_size=bs)
    be = TorchBackend("cpu")
    return be.mla_attention(q_lat, q_pe, cache, be.plan_attention(meta, R + P), SCALE, R)


dtypes = {"float32": (torch.float32, torch.float32), "bf16": (torch.bfloat16, torch.bfloat16),
          "fp8": (torch.float8_e4m3fn, torch.bfloat16), "f32cache_bf16q": (torch.float32, torch.bfloat16)}
cases = [
    # (dtype, H, block_size, context lengths, num_splits values, block_n)
    ("float32", 4, 4, [1, 70, 17, 33, 4], [None, 1, 3, 40], 16),
    ("float32", 16, 16, [16, 65, 1, 31], [None, 2, 9], 32),
    ("float32", 1, 16, [70, 5], [1, 4], 16),
    ("float32", 20, 4, [23, 9], [1, 2], 16),  # two head blocks, the second partial
    ("bf16", 16, 16, [1, 70, 47, 16], [None, 1, 3, 40], 16),
    ("bf16", 4, 4, [69, 2, 30], [1, 5], 32),
    ("fp8", 4, 16, [70, 1, 18, 33], [None, 1, 2, 40], 16),
    ("fp8", 1, 4, [13, 64], [1, 3], 32),
    ("f32cache_bf16q", 16, 4, [37, 3], [1, 2], 16),
    ("bf16", 64, 16, [150, 5], [None, 3], None),  # default tiles at 64 heads: all heads in one program
]
results = []
for i, (name, H, bs, lens, splits, block_n) in enumerate(cases):
    cache_dtype, q_dtype = dtypes[name]
    q_lat, q_pe, clean, poisoned, tables, lens_t = make_case(i, lens, H, bs, cache_dtype, q_dtype)
    ref = reference(q_lat, q_pe, clean, tables, lens_t)
    tb = torch_backend(q_lat, q_pe, clean, tables, lens_t).double()
    assert not torch.isnan(tb).any()
    top = float(ref.abs().max())
    for ns in splits:
        out = mla_decode(q_lat, q_pe, poisoned, tables, lens_t, SCALE, num_splits=ns, block_n=block_n)
        results.append({"case": name, "H": H, "bs": bs, "lens": lens, "splits": ns, "block_n": block_n,
                        "dtype_ok": out.dtype == q_dtype and tuple(out.shape) == (len(lens), H, R),
                        "nan": bool(torch.isnan(out).any()),
                        "err_ref": float((out.double() - ref).abs().max()) / top,
                        "err_torch": float((out.double() - tb).abs().max()) / top})
print("RESULT" + json.dumps(results))
"""

TOL = {  # relative to max |output|: (vs float64 reference, vs torch backend)
    "float32": (1e-5, 1e-5),
    "bf16": (2e-2, 3e-2),
    "fp8": (2e-2, 3e-2),
    "f32cache_bf16q": (2e-2, 3e-2),
}


def test_mla_decode_kernel_under_interpreter():
    here = Path(__file__).parent
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    results = json.loads(line[len("RESULT"):])
    assert len(results) == 27
    for res in results:
        tol_ref, tol_torch = TOL[res["case"]]
        assert res["dtype_ok"], res
        assert not res["nan"], res  # NaN = a read outside the context (padding block or a block's tail)
        assert res["err_ref"] < tol_ref, res
        assert res["err_torch"] < tol_torch, res


def test_split_heuristic_uses_shapes_only():
    from k2bench.engine.kernels.triton_attention import MAX_SPLITS, default_num_splits

    # one sequence, 16 heads, 8k-token table on 132 SMs: many splits, capped
    assert default_num_splits(1, 16, 512, 16, num_sms=132) == MAX_SPLITS
    # 8 sequences of 64 heads in 16-head programs = 32 programs, 264 resident slots: 8 splits fill one round
    assert default_num_splits(8, 64, 512, 16, num_sms=132) == 8
    # a short table limits the splits (256 tokens per split at least)
    assert default_num_splits(1, 16, 32, 16, num_sms=132) == 2
    assert default_num_splits(1, 16, 4, 16, num_sms=132) == 1
    # 64 heads in one program (one resident per SM): one round of 132 programs at most
    assert default_num_splits(32, 64, 512, 16, num_sms=132, block_h=64) == 4
    assert default_num_splits(4, 64, 512, 16, num_sms=132, block_h=64) == MAX_SPLITS
    assert default_num_splits(128, 64, 512, 16, num_sms=132, block_h=64) == 1
    # large batches: no split
    assert default_num_splits(128, 64, 512, 16, num_sms=132) == 1
    assert default_num_splits(300, 8, 512, 16, num_sms=132) == 1


def test_mla_decode_rejects_bad_shapes():
    import torch

    from k2bench.engine.kernels.triton_attention import mla_decode

    lens = torch.ones(2, dtype=torch.long)
    tables = torch.zeros(2, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="power of two"):
        mla_decode(torch.zeros(2, 4, 48), torch.zeros(2, 4, 16), torch.zeros(3, 4, 64), tables, lens, 1.0)
    with pytest.raises(ValueError, match="do not fit"):
        mla_decode(torch.zeros(2, 4, 64), torch.zeros(2, 4, 16), torch.zeros(3, 4, 96), tables, lens, 1.0)
    args = (torch.zeros(2, 4, 64), torch.zeros(2, 4, 16), torch.zeros(3, 4, 80), tables, lens, 1.0)
    with pytest.raises(ValueError, match="unknown MLA decode variant 'cuda': hopper, triton"):
        mla_decode(*args, variant="cuda")
    with pytest.raises(ValueError, match="hopper MLA decode kernel needs an sm_90 GPU"):  # CPU tensors
        mla_decode(*args, variant="hopper")


@pytest.mark.gpu
def test_mla_decode_on_cuda_against_torch_backend():
    """For a GPU run (the lead's): real MLA widths (r=512, p=64, block 16) against the torch backend."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from k2bench.engine.kernels.torch_backend import TorchBackend
    from k2bench.engine.kernels.triton_attention import mla_decode
    from k2bench.engine.model.attn_meta import AttentionMetadata

    g = torch.Generator().manual_seed(0)
    r, p, bs = 512, 64, 16
    lens = torch.tensor([1, 4097, 300, 2000, 17])
    need = [-(-int(n) // bs) for n in lens]
    perm = torch.randperm(sum(need) + 1, generator=g)
    perm = perm[perm != 0]
    tables = torch.zeros(len(lens), max(need), dtype=torch.long)
    used = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[used:used + n]
        used += n
    scale = 192 ** -0.5
    be = TorchBackend("cuda")
    f32, bf16 = torch.float32, torch.bfloat16
    for cache_dtype, H, q_dtype in ((bf16, 16, bf16), (torch.float8_e4m3fn, 16, bf16), (bf16, 64, bf16), (f32, 64, f32)):
        cache = torch.randn(sum(need) + 1, bs, r + p, generator=g).to(cache_dtype).cuda()
        q_lat = torch.randn(len(lens), H, r, generator=g).to(q_dtype).cuda()
        q_pe = torch.randn(len(lens), H, p, generator=g).to(q_dtype).cuda()
        B = len(lens)
        meta = AttentionMetadata(cu_seqlens_q=torch.arange(B + 1, dtype=torch.int32).cuda(), context_lens=lens.cuda(),
                                 slot_mapping=torch.zeros(B, dtype=torch.long).cuda(), block_tables=tables.cuda(),
                                 block_size=bs)
        ref = be.mla_attention(q_lat, q_pe, cache, be.plan_attention(meta, r + p), scale, r).float()
        for ns in (None, 1, 4):
            out = mla_decode(q_lat, q_pe, cache, tables.cuda(), lens.cuda(), scale, num_splits=ns).float()
            assert float((out - ref).abs().max()) < 3e-2 * float(ref.abs().max())
    # compiled above: a call must not synchronise with the host (it runs inside CUDA graphs)
    t_dev, l_dev = tables.cuda(), lens.cuda()
    torch.cuda.synchronize()
    try:
        with warnings.catch_warnings():  # torch notes that the sync check is a prototype feature
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode("error")
        for ns in (None, 1, 4):
            mla_decode(q_lat, q_pe, cache, t_dev, l_dev, scale, num_splits=ns)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
def test_hopper_mla_decode_against_float64():
    """The Gluon kernel (engine/kernels/gluon_mla_decode.py) at real widths on an sm_90 GPU, against the
    float64 reference on a poisoned cache (NaN in block 0 and past every context, so an out-of-context
    read shows), for ragged lengths (1 token, partial tiles, one split longer than the others) and
    every tile / buffer / prefetch setting and split count it takes; it must be the default there."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")
    ns: dict = {}
    # the child script's float64 reference and case builder, at real widths (it pins threads: not here)
    exec(CHILD.split("def torch_backend")[0].replace("R, P = 64, 16", "R, P = 512, 64")
         .replace("torch.set_num_threads(1)", ""), ns)
    from k2bench.engine.kernels.triton_attention import hopper_eligible, mla_decode

    lens = [1, 4097, 300, 2000, 17, 64, 65]
    q_lat, q_pe, clean, poisoned, tables, lens_t = ns["make_case"](7, lens, 64, 16, torch.bfloat16, torch.bfloat16)
    ref = ns["reference"](q_lat, q_pe, clean, tables, lens_t)
    top = float(ref.abs().max())
    dev = [x.cuda() for x in (q_lat, q_pe, poisoned, tables, lens_t)]
    assert hopper_eligible(dev[0], dev[1], dev[2])
    # every tile and buffer count the kernel takes, with and without the L2 prefetch
    for block_n, nbuf, prefetch in ((64, 2, False), (64, 2, True), (32, 2, True), (32, 3, False), (32, 4, False)):
        for splits in (None, 1, 3, 8):
            out = mla_decode(*dev, ns["SCALE"], num_splits=splits, variant="hopper", block_n=block_n, nbuf=nbuf,
                             prefetch=prefetch)
            cfg = (block_n, nbuf, prefetch, splits)
            assert out.dtype == torch.bfloat16 and tuple(out.shape) == (len(lens), 64, 512)
            assert not torch.isnan(out).any(), cfg
            err = float((out.double().cpu() - ref).abs().max()) / top
            assert err < 2e-2, (cfg, err)
    default = mla_decode(*dev, ns["SCALE"])
    forced = mla_decode(*dev, ns["SCALE"], variant="hopper")
    assert torch.equal(default, forced)
    # a query view off 16-byte boundaries (one element into a wider buffer) gives the same output: the
    # query travels by cp.async, which needs aligned rows, so the kernel takes an aligned copy of it
    wide = torch.zeros(len(lens), 64, 72, dtype=torch.bfloat16, device="cuda")
    wide[:, :, 1:65] = dev[1]
    odd_pe = wide[:, :, 1:65]
    assert odd_pe.data_ptr() % 16
    assert torch.equal(mla_decode(dev[0], odd_pe, *dev[2:], ns["SCALE"], num_splits=3),
                       mla_decode(*dev, ns["SCALE"], num_splits=3))
    tl_out = mla_decode(*dev, ns["SCALE"], variant="triton")
    assert float((tl_out.double() - default.double()).abs().max()) < 2e-2 * top
    with pytest.raises(ValueError, match="hopper MLA decode kernel needs"):
        mla_decode(dev[0].float(), dev[1].float(), dev[2].float(), dev[3], dev[4], 0.1, variant="hopper")
    torch.cuda.synchronize()
    try:  # compiled above: no call may synchronise with the host (decode runs inside CUDA graphs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode("error")
        for splits in (None, 1, 3):
            mla_decode(*dev, ns["SCALE"], num_splits=splits)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_decode_kernels_leave_the_same_step_sizes_unspecialised():
    """The Triton and Gluon stage-1 kernels take the same arguments, and neither specialises the ones that
    change from one eager step to the next (a new value that is 1 or a multiple of 16 would compile a new
    variant mid-step); each name is one of the kernels' parameters. Read in a child process without
    TRITON_INTERPRET: the interpreter's kernel objects do not keep the decorator's arguments."""
    pytest.importorskip("triton.experimental.gluon")
    code = (
        "import json\n"
        "from k2bench.engine.kernels import gluon_mla_decode as g, triton_attention as t\n"
        "print(json.dumps([sorted(t.DECODE_UNSPECIALISED)] + [[list(f.arg_names), "
        "sorted(f.arg_names[i] if isinstance(i, int) else i for i in f.do_not_specialize)] "
        "for f in (t._mla_decode_split, g.mla_decode_hopper)]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    names, *kernels = json.loads(out.stdout.strip().splitlines()[-1])
    for arg_names, unspecialised in kernels:
        assert set(names) <= set(arg_names), arg_names
        assert unspecialised == names
