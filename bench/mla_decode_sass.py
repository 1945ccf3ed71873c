"""The Gluon MLA decode kernel compiled for sm_90 on a machine without a GPU: what its loop costs.

Before spending device time, read what ptxas made of `gluon_mla_decode.mla_decode_hopper` for one
configuration: registers, spills, shared memory, and per iteration of the tile loop the CTA-wide
barriers (BAR.SYNC), wgmma instructions (HGMMA) and cp.async copies (LDGSTS) in the SASS. With --ptx
the PTX is written without its debug sections, so two versions of the kernel can be diffed (the
2026-12-01 mla4 clean-up was checked that way: identical PTX for every configuration it measured).

Needs the triton the device runs (3.6: Gluon's cp.async name changed in 3.9), which brings ptxas and
nvdisasm; for example `pip install --target /tmp/t36 --no-deps triton==3.6.0`, then

    PYTHONPATH=/tmp/t36 python bench/mla_decode_sass.py [--block-n 64 --nbuf 2 --direct --prefetch] [--ptx F]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from k2bench.engine.kernels.gluon_mla_decode import mla_decode_hopper

POINTERS = {"q_lat_ptr": "*bf16", "q_pe_ptr": "*bf16", "kv_ptr": "*bf16", "tables_ptr": "*i64", "lens_ptr": "*i64",
            "out_ptr": "*fp32", "lse_ptr": "*fp32"}
# strides that are multiples of 16 elements in the engine's tensors (triton's launcher specialises on it)
ALIGNED = {"s_kvb", "s_kvt", "s_qlb", "s_qlh", "s_qpb", "s_qph", "s_tb", "s_ob", "s_oh", "s_os"}


def compile_kernel(consts: dict):
    """One configuration compiled for sm_90a as triton's launcher would build it (asm, metadata)."""
    names = mla_decode_hopper.arg_names
    sig = {n: "constexpr" if n in consts else POINTERS.get(n, "fp32" if n == "qk_scale" else "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in POINTERS or n in ALIGNED}
    src = GluonASTSource(mla_decode_hopper, sig, consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8))


def loop_counts(sass: str) -> dict:
    """Instruction counts inside the longest backward branch of the SASS (the tile loop)."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"\s*\.(L_x_\d+):", line))}
    loops = [(labels[m.group(1)], i) for i, line in enumerate(lines)
             if (m := re.search(r"BRA `\(\.(L_x_\d+)\)", line)) and labels.get(m.group(1), i) < i]
    first, last = max(loops, key=lambda span: span[1] - span[0])
    body = lines[first:last + 1]
    return {op: sum(op in line for line in body) for op in ("BAR.SYNC", "HGMMA", "LDGSTS", "MUFU.EX2")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--nbuf", type=int, default=2)
    ap.add_argument("--direct", action="store_true", help="the unsplit epilogue (one split per sequence)")
    ap.add_argument("--prefetch", action="store_true")
    ap.add_argument("--ptx", type=Path, help="write the PTX here, debug sections left out")
    args = ap.parse_args()
    consts = dict(H=64, R=512, P=64, PAGE=16, BLOCK_N=args.block_n, NBUF=args.nbuf, DIRECT=args.direct,
                  PREFETCH=args.prefetch)
    kernel = compile_kernel(consts)
    asm = kernel.asm
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(asm["cubin"])
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(asm["ptx"])
        info = subprocess.run([bin_dir / "ptxas", "-arch=sm_90a", "-v", ptx, "-o", Path(tmp) / "v.cubin"],
                              capture_output=True, text=True).stderr
        sass = subprocess.run([bin_dir / "nvdisasm", "-c", cubin], capture_output=True, text=True, check=True).stdout
    regs = re.search(r"Used (\d+) registers", info)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
    print(f"{consts}\nregisters {regs.group(1) if regs else '?'}, spill stores/loads (bytes) "
          f"{'/'.join(spills.groups()) if spills else '?'}, shared memory {kernel.metadata.shared} bytes")
    print(f"per loop iteration: {loop_counts(sass)}")
    if args.ptx:
        args.ptx.write_text("".join(line + "\n" for line in asm["ptx"].splitlines()
                                    if not re.match(r"\s*(\.loc|\.file|//)", line) and "DW_AT" not in line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
