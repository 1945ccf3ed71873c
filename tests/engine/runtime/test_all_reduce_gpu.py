"""The one-shot all-reduce against NCCL on two GPUs: random tensors of several sizes and dtypes, eagerly
and replayed from a CUDA graph. With two ranks each element is one addition, so the two must agree bit
for bit. Skipped below two CUDA devices."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from k2bench.net import free_port

pytestmark = [pytest.mark.engine, pytest.mark.gpu]

HIDDEN = 7168
TOKENS = (1, 3, 4, 32, 36)  # 36 x 7168 bf16 is just under the default 512 KiB
MAX_BYTES = 1 << 20
# (tokens, hidden, dtype): decode-sized rows in both dtypes, odd widths, and one float32 tensor over MAX_BYTES
CASES = [(n, HIDDEN, d) for n in TOKENS for d in (torch.bfloat16, torch.float32)] + [
    (1, 1000, torch.bfloat16), (5, 4100, torch.float32), (40, HIDDEN, torch.float32)]


def _rank(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from k2bench.engine.model.allreduce import AllReduce

    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=dev)
    r = AllReduce()
    res: dict = {"line": r.setup(MAX_BYTES, dev, (torch.bfloat16, torch.float32), required=True, rank=rank)}
    gen = torch.Generator(device=dev).manual_seed(10 + rank)
    mismatches = []
    for n, h, d in CASES:
        x = torch.randn(n, h, generator=gen, device=dev).to(d)
        ref = x.clone()
        dist.all_reduce(ref)
        before = r.calls["one-shot"]
        took = r.use_one_shot(x)
        got = r(x.clone())
        if took != (r.calls["one-shot"] == before + 1) or not torch.equal(got, ref):
            mismatches.append((n, h, str(d), took, float((got.float() - ref.float()).abs().max())))
        res.setdefault("took", []).append(took)
    res["eager_mismatches"] = mismatches
    # Under capture: a decode-like bf16 tensor summed in place, the graph replayed on fresh inputs.
    x = torch.zeros(32, HIDDEN, dtype=torch.bfloat16, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        r(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = r(x).mul_(1)  # a kernel after the sum, reading its result within the graph
    graph_bad = []
    for step in range(4):
        x.copy_(torch.randn(32, HIDDEN, generator=gen, device=dev).to(torch.bfloat16))
        ref = x.clone()
        dist.all_reduce(ref)
        graph.replay()
        torch.cuda.synchronize()
        if not torch.equal(y, ref):
            graph_bad.append(step)
    res["graph_mismatches"] = graph_bad
    torch.save(res, f"{out}.{rank}")
    dist.destroy_process_group()


def test_one_shot_equals_nccl_eagerly_and_under_cuda_graphs(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    out = str(tmp_path / "res")
    mp.start_processes(_rank, args=(2, free_port(), out), nprocs=2, join=True, start_method="spawn")
    for k in (0, 1):
        res = torch.load(f"{out}.{k}")
        assert res["line"].startswith("all-reduce: one-shot over symmetric memory up to 1048576 bytes"), res["line"]
        # the path taken is the one the sizes call for (the last case, 1.1 MB, goes to NCCL), and agrees
        assert res["took"] == [n * h * (2 if d == torch.bfloat16 else 4) <= MAX_BYTES for n, h, d in CASES]
        assert res["took"].count(False) == 1
        assert res["eager_mismatches"] == []
        assert res["graph_mismatches"] == []
