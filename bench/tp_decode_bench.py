"""Decode-step time at tensor parallel N for each all-reduce path (NCCL, one-shot), and the all-reduce alone.

Spawns one process per GPU, loads the checkpoint's shard on each (triton backend), fills a paged latent
cache so that every sequence holds `--ctx` tokens (scattered blocks, zeros: the step reads them all the
same), and for each all-reduce mode captures the decode CUDA graphs of the engine (`DecodeGraphs`, as the
server does) for the batch sizes asked, then times their replays with CUDA events (median of `--reps`,
rank 0's clock; every rank replays in lockstep since the graphs hold collectives). Per mode and batch it
also keeps the logits' greedy tokens, and compares them with the first mode's: at TP 2 every element of a
sum is one addition, so the two paths must give the same logits bit for bit. Then it times the
all-reduce alone on a [batch, hidden] tensor of the model's dtype (ten calls replayed from one graph).

    python bench/tp_decode_bench.py --model /tmp/k2w --tp 2 --batches 4,32,128 --out tp_decode.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

import torch
import torch.multiprocessing as mp

from k2bench.net import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_gpu_bench import cuda_time_ms  # noqa: E402

CALLS = 10  # all-reduces per timed graph in the all-reduce-alone measure


def step_inputs(batch: int, ctx: int, block_size: int, num_blocks: int, vocab: int, dev: torch.device):
    """The same on every rank (fixed seed): ids, positions, slots, context lengths, block tables."""
    g = torch.Generator().manual_seed(batch)
    per_seq = -(-ctx // block_size)
    tables = torch.randperm(num_blocks, generator=g)[: batch * per_seq].view(batch, per_seq)
    pos = torch.full((batch,), ctx - 1, dtype=torch.int64)
    slots = tables[:, (ctx - 1) // block_size] * block_size + (ctx - 1) % block_size
    ids = torch.randint(16, vocab, (batch,), generator=g)
    return [t.to(dev) for t in (ids, pos, slots, pos + 1, tables)]


def alone_us(reducer, batch: int, hidden: int, dtype: torch.dtype, dev: torch.device, reps: int) -> float:
    """One all-reduce of [batch, hidden], in microseconds: CALLS back to back replayed from one graph."""
    from k2bench.engine.runtime.cuda_graphs import capture_graph

    x = torch.randn(batch, hidden, device=dev).to(dtype)
    graph, _ = capture_graph(lambda: [reducer(x) for _ in range(CALLS)])
    return cuda_time_ms(graph.replay, reps, warmup=3)[0] * 1000 / CALLS


def rank_main(rank: int, args: argparse.Namespace, port: int) -> None:
    with torch.inference_mode():  # as the runner steps: the graphs' outputs are inference tensors
        _rank_main(rank, args, port)


def _rank_main(rank: int, args: argparse.Namespace, port: int) -> None:
    import torch.distributed as dist

    from k2bench.engine.model.loader import load_model
    from k2bench.engine.runtime.cuda_graphs import DecodeGraphs
    from k2bench.engine.runtime.runner import kv_torch_dtype

    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    if args.tp > 1:
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.tp,
                                device_id=dev)
    model, cfg = load_model(args.model, device=dev, backend="triton", tp_rank=rank, tp_size=args.tp)
    batches = sorted(args.batches)
    bs = 32
    per_seq = -(-args.ctx // bs)
    num_blocks = batches[-1] * per_seq
    kv_dtype = kv_torch_dtype("auto", model.par.dtype)
    # one scratch block past the sequences' blocks takes the graphs' padding rows
    caches = [torch.zeros(num_blocks + 1, bs, cfg.kv_cache_dim, dtype=kv_dtype, device=dev)
              for _ in range(cfg.num_hidden_layers)]
    inputs = {b: step_inputs(b, args.ctx, bs, num_blocks, cfg.vocab_size, dev) for b in batches}
    rows = []
    first_tokens: dict[int, list[int]] = {}
    first_logits: dict[int, torch.Tensor] = {}
    modes = args.modes if args.tp > 1 else ["none"]
    for mode in modes:
        line = "tp 1: no all-reduce"
        if args.tp > 1:
            # not required: where one-shot cannot run, the row says so (its setup line, one_shot_taken false)
            line = model.par.reducer.setup(args.one_shot_max_bytes, dev, (model.par.dtype, torch.float32),
                                           enabled=mode != "nccl", rank=rank)
        graphs = DecodeGraphs(model, caches, scratch_block=num_blocks, block_size=bs, max_blocks=per_seq,
                              max_batch=batches[-1], device=dev, buckets=batches)
        graphs.capture()
        for b in batches:
            inp = inputs[b]
            ms, _ = cuda_time_ms(functools.partial(graphs.run, *inp), args.reps, warmup=3)
            logits = graphs.run(*inp).float()
            torch.cuda.synchronize()
            tokens = logits.argmax(-1).tolist()
            row = {"mode": mode, "batch": b, "step_ms": round(ms, 4), "setup": line}
            if b in first_logits:
                row["tokens_equal_first_mode"] = tokens == first_tokens[b]
                row["logits_equal_first_mode"] = bool(torch.equal(logits, first_logits[b]))
                row["logits_max_abs_diff"] = float((logits - first_logits[b]).abs().max())
            else:
                first_tokens[b], first_logits[b] = tokens, logits
            if args.tp > 1:
                row["all_reduce_alone_us"] = round(alone_us(model.par.reducer, b, cfg.hidden_size, model.par.dtype,
                                                            dev, args.reps), 2)
                row["one_shot_taken"] = model.par.reducer.use_one_shot(
                    torch.empty(b, cfg.hidden_size, dtype=model.par.dtype, device=dev))
            rows.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
        graphs = None  # its memory back before the next mode's capture
        if rank == 0:  # after each mode, so a run cut short keeps what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({
                "model": args.model, "tp": args.tp, "ctx": args.ctx, "dtype": str(model.par.dtype),
                "a4w4": model.par.a4w4, "one_shot_max_bytes": args.one_shot_max_bytes, "reps": args.reps,
                "all_reduces_per_step": 2 * cfg.num_hidden_layers,  # after o_proj and after the MLP/MoE, per layer
                "torch": torch.__version__, "device": torch.cuda.get_device_name(dev), "rows": rows}, indent=2))
    if args.tp > 1:
        dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[4, 32, 128])
    ap.add_argument("--ctx", type=int, default=8192, help="cached tokens per sequence")
    ap.add_argument("--modes", type=lambda s: s.split(","), default=["nccl", "one-shot"],
                    help="all-reduce modes in order (nccl, one-shot, auto; one-shot falls back and says so "
                         "where it cannot run); the first is the reference for tokens and logits")
    ap.add_argument("--one-shot-max-bytes", type=int, default=4 << 20,
                    help="one-shot threshold while measuring (default 4 MiB: every batch asked takes it)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("tp_decode.json"))
    args = ap.parse_args()
    if torch.cuda.device_count() < args.tp:
        raise SystemExit(f"--tp {args.tp} needs {args.tp} CUDA devices; this machine has {torch.cuda.device_count()}")
    mp.start_processes(rank_main, args=(args, free_port()), nprocs=args.tp, join=True, start_method="spawn")
    data = json.loads(args.out.read_text())
    n_ar = data["all_reduces_per_step"]
    # AR share: the step's all-reduces timed alone (n_ar of them) over the step time
    print(f"{'mode':>9} {'batch':>5} {'step ms':>8} {'AR us':>7} {'AR share':>8} {'one-shot':>8} {'= first mode':>12}")
    for r in data["rows"]:
        same = r.get("logits_equal_first_mode", "ref")
        ar = r.get("all_reduce_alone_us", 0.0)
        print(f"{r['mode']:>9} {r['batch']:>5} {r['step_ms']:>8.3f} {ar:>7.1f} {ar * n_ar / 10 / r['step_ms']:>7.1f}% "
              f"{str(r.get('one_shot_taken', '-')):>8} {str(same):>12}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
