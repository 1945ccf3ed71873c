"""CUDA graphs of pure-decode steps: one captured forward (model + logits) per padded batch size.

At small batch a decode step is mostly CPU time (hundreds of kernel launches from Python); replaying
a captured graph launches them all at once. Captured once at start-up on every tensor-parallel rank,
in the same order, so the NCCL collectives inside the graphs line up across ranks.

A step of n sequences that each bring one token replays the graph of the smallest bucket >= n. Its
inputs are copied into static device buffers; the padding rows point at a scratch cache block that
no sequence owns (one block past the block manager's), with context length 1, so they compute
garbage nobody reads and write it where nobody looks. Steps with prefill chunks, and batches larger
than the largest bucket, run eagerly.

Needs a backend whose decode plan is built from tensors alone (`graph_decode`: no host sync): the
triton backend. Everything inside the forward must be free of host syncs and data-dependent shapes;
tests/engine/runtime/test_cuda_graphs_gpu.py checks replayed tokens against eager ones.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from k2bench.engine.model.attn_meta import AttentionMetadata

log = logging.getLogger(__name__)
T = TypeVar("T")

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512)


def capture_graph(fn: Callable[[], T], pool: tuple[int, int] | None = None) -> tuple[torch.cuda.CUDAGraph, T]:
    """A CUDA graph of fn and the output tensors it captured. fn runs once first on a side stream, so
    kernels compile and lazy caches fill outside the capture (which forbids both)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


def buckets_for(max_batch: int) -> list[int]:
    return sorted({b for b in BUCKETS if b < max_batch} | {max_batch})


class DecodeGraphs:
    def __init__(self, model, kv_caches: list[torch.Tensor], *, scratch_block: int, block_size: int,
                 max_blocks: int, max_batch: int, device: torch.device, buckets: list[int] | None = None) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.scratch_slot = scratch_block * block_size
        self.buckets = sorted(buckets) if buckets else buckets_for(max_batch)
        m = self.buckets[-1]
        i64 = dict(dtype=torch.int64, device=device)
        # ids, positions, slots and context lengths as the rows of one buffer: one copy from the host fills them
        self.small = torch.tensor([[0] * m, [0] * m, [self.scratch_slot] * m, [1] * m], **i64)
        self.ids, self.pos, self.slots, self.lens = self.small.unbind(0)
        self.tables = torch.full((m, max_blocks), scratch_block, **i64)
        # pinned host twins of the two buffers, so a step's inputs go up in two asynchronous copies
        self._host_small = self.small.cpu().pin_memory()
        self._host_tables = self.tables.cpu().pin_memory()
        self._uploaded: torch.cuda.Event | None = None  # the last upload, before the twins are rewritten
        self._pad = torch.tensor([[0], [0], [self.scratch_slot], [1]], dtype=torch.int64)  # a padding row's inputs
        self.cu = torch.arange(m + 1, **i64)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.pool = None
        self.replays = 0

    def _forward(self, b: int) -> torch.Tensor:
        meta = AttentionMetadata(cu_seqlens_q=self.cu[: b + 1], context_lens=self.lens[:b],
                                 slot_mapping=self.slots[:b], block_tables=self.tables[:b], block_size=self.block_size)
        plan = self.model.par.backend.decode_plan(meta, self.model.cfg.kv_cache_dim)
        hidden = self.model(self.ids[:b], self.pos[:b], meta, self.kv_caches, plan=plan)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket, largest first (the shared memory pool is sized by the first)."""
        t0 = time.perf_counter()
        for b in reversed(self.buckets):
            graph, self.logits[b] = capture_graph(functools.partial(self._forward, b), self.pool)
            self.pool = graph.pool()
            self.graphs[b] = graph
        torch.cuda.synchronize()
        log.info("captured %d decode CUDA graphs (batch %s) in %.1f s", len(self.buckets),
                 ",".join(map(str, self.buckets)), time.perf_counter() - t0)

    def bucket(self, n: int) -> int | None:
        return next((b for b in self.buckets if b >= n), None)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
            context_lens: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
        """Logits [n, vocab] of one pure-decode step of n <= the largest bucket sequences.

        Inputs on the host (the server's rank) are staged in pinned memory and uploaded in two copies;
        inputs already on the device (tensor-parallel workers) are copied into the buffers there. Input ids
        on the device beside host positions are the tokens a step launched ahead of reading them (the
        previous step's samples): copied in after the upload, in stream order."""
        n = input_ids.numel()
        b = self.bucket(n)
        if positions.device.type == "cpu":
            ahead = input_ids.device.type != "cpu"
            self._stage(n, b, None if ahead else input_ids, positions, slot_mapping, context_lens, block_tables)
            if ahead:
                self.ids[:n].copy_(input_ids, non_blocking=True)
        else:
            self._copy_on_device(n, b, input_ids, positions, slot_mapping, context_lens, block_tables)
        self.graphs[b].replay()
        self.replays += 1
        return self.logits[b][:n]

    def _stage(self, n: int, b: int, *inputs: torch.Tensor | None) -> None:
        """Fill the pinned twins on the host (padding rows point at the scratch block), then upload them:
        per step a handful of host writes and two copies instead of ten copies and three fills on the GPU."""
        if self._uploaded is not None:
            self._uploaded.synchronize()  # the previous upload has left the twins
        hs, ht = self._host_small, self._host_tables
        for row, t in enumerate(inputs[:4]):
            if t is not None:  # no ids: they are copied in on the device after the upload
                hs[row, :n] = t
        hs[:, n:] = self._pad
        bt = inputs[4]
        ht[:n, : bt.shape[1]] = bt
        ht[n:b, 0] = self.scratch_block
        self.small.copy_(hs, non_blocking=True)
        self.tables[:b].copy_(ht[:b], non_blocking=True)
        self._uploaded = torch.cuda.Event()
        self._uploaded.record()

    def _copy_on_device(self, n: int, b: int, input_ids: torch.Tensor, positions: torch.Tensor,
                        slot_mapping: torch.Tensor, context_lens: torch.Tensor, block_tables: torch.Tensor) -> None:
        self.ids[:n].copy_(input_ids, non_blocking=True)
        self.pos[:n].copy_(positions, non_blocking=True)
        self.slots[:n].copy_(slot_mapping, non_blocking=True)
        self.lens[:n].copy_(context_lens, non_blocking=True)
        self.tables[:n, : block_tables.shape[1]].copy_(block_tables, non_blocking=True)
        if b > n:  # rows left from an earlier, larger step must not write into live cache slots
            self.slots[n:b].fill_(self.scratch_slot)
            self.lens[n:b].fill_(1)
            self.tables[n:b, 0].fill_(self.scratch_block)
