"""Turns a scheduled batch into model inputs, runs the model on the paged KV cache, and samples.

The step inputs are plain integer tensors packed into one int64 buffer (`StepInputs.pack`), so
that tensor-parallel workers receive a whole step with two broadcasts and rebuild the same
AttentionMetadata. Block tables live in a persistent [rows, max_blocks] tensor that is
patched only where a sequence's block list changed, so no step rebuilds them from Python lists.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from k2bench.engine.model.attn_meta import AttentionMetadata
from k2bench.engine.runtime.block_manager import blocks_for
from k2bench.engine.runtime.sampling import sample_tensor
from k2bench.engine.runtime.scheduler import SchedulerOutput
from k2bench.engine.runtime.sequence import Sequence

log = logging.getLogger(__name__)

HEADER_LEN = 4  # T, B, max_blocks, num_sample


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    cu_seqlens: torch.Tensor  # [B+1]
    context_lens: torch.Tensor  # [B]
    slot_mapping: torch.Tensor  # [T]
    block_tables: torch.Tensor  # [B, max_blocks]
    sample_idx: torch.Tensor  # [n]: rows of the flat batch whose logits are sampled

    def pack(self) -> tuple[torch.Tensor, torch.Tensor]:
        t, b = self.input_ids.numel(), self.context_lens.numel()
        header = torch.tensor([t, b, self.block_tables.shape[1], self.sample_idx.numel()], dtype=torch.int64)
        body = torch.cat([self.input_ids, self.positions, self.cu_seqlens, self.context_lens,
                          self.slot_mapping, self.block_tables.reshape(-1), self.sample_idx])
        return header, body

    @staticmethod
    def body_len(header: torch.Tensor) -> int:
        t, b, mb, n = (int(x) for x in header.tolist())
        return 3 * t + (b + 1) + b + b * mb + n

    @classmethod
    def unpack(cls, header: torch.Tensor, body: torch.Tensor) -> StepInputs:
        t, b, mb, n = (int(x) for x in header.tolist())
        parts = torch.split(body, [t, t, b + 1, b, t, b * mb, n])
        return cls(parts[0], parts[1], parts[2], parts[3], parts[4], parts[5].view(b, mb), parts[6])


@dataclass
class SampledTokens:
    """A step's sampled tokens, launched and not yet read: `device` holds them where the model runs (the
    next step's input ids can be taken from there), `host` is the copy on its way back, done at `ready`."""
    device: torch.Tensor | None  # [n] int64; None when no row samples
    host: torch.Tensor | None = None
    ready: torch.cuda.Event | None = None


def kv_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    if kv_cache_dtype == "fp8":
        return torch.float8_e4m3fn
    if kv_cache_dtype == "bfloat16":
        return torch.bfloat16
    return model_dtype


def kv_block_bytes(num_layers: int, block_size: int, kv_dim: int, dtype: torch.dtype) -> int:
    return num_layers * block_size * kv_dim * torch.empty((), dtype=dtype).element_size()


class ModelRunner:
    """Owns the model and the per-layer latent KV caches of one rank."""

    def __init__(self, model, cfg, *, num_blocks: int, block_size: int, kv_dtype: torch.dtype,
                 max_model_len: int, max_rows: int, device: torch.device | str = "cpu", cuda_graphs: bool = False):
        self.model = model
        self.cfg = cfg
        self.device = torch.device(device)
        self.block_size = block_size
        self.num_blocks = num_blocks
        graphs = cuda_graphs and self.device.type == "cuda" and model.par.backend.graph_decode
        # with graphs, one scratch block past the block manager's takes the padding rows' writes
        self.kv_caches = [
            torch.zeros(num_blocks + int(graphs), block_size, cfg.kv_cache_dim, dtype=kv_dtype, device=self.device)
            for _ in range(cfg.num_hidden_layers)
        ]
        self.max_blocks = blocks_for(max_model_len, block_size)
        self.graphs = None
        if graphs:
            from k2bench.engine.runtime.cuda_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(model, self.kv_caches, scratch_block=num_blocks, block_size=block_size,
                                       max_blocks=self.max_blocks, max_batch=max_rows, device=self.device)
            self.graphs.capture()
        # Persistent block tables on the host (rank 0 only): row r belongs to one running sequence.
        self._bt = torch.zeros(max_rows, self.max_blocks, dtype=torch.int64)
        self._free_rows = list(range(max_rows - 1, -1, -1))
        self._row: dict[int, int] = {}  # seq_id -> row
        self._synced: dict[int, int] = {}  # seq_id -> entries of the row that match seq.block_table

    # ---- host side: build inputs (rank 0) ---------------------------------------------------
    def release(self, seq: Sequence) -> None:
        row = self._row.pop(seq.seq_id, None)
        if row is not None:
            self._free_rows.append(row)
        self._synced.pop(seq.seq_id, None)

    def _row_of(self, seq: Sequence) -> int:
        row = self._row.get(seq.seq_id)
        if row is None:
            row = self._free_rows.pop()
            self._row[seq.seq_id] = row
            self._synced[seq.seq_id] = 0
        have = self._synced[seq.seq_id]
        table = seq.block_table
        if have > len(table):
            have = 0  # the blocks were freed and handed out again
        if have < len(table):
            self._bt[row, have : len(table)] = torch.tensor(table[have:], dtype=torch.int64)
            self._synced[seq.seq_id] = len(table)
        return row

    def prepare(self, sched: SchedulerOutput, input_ids: torch.Tensor | None = None) -> StepInputs:
        """The step's input tensors, built from Python lists in one `torch.tensor` call (split into views):
        each call costs microseconds of host time per step, which a decode step at low concurrency does
        not hide behind the device.

        `input_ids` (on the model's device) are the tokens of a decode step scheduled before the step
        that samples them has been read (`Scheduler.schedule_ahead`): one per sequence, in batch order."""
        ids: list[int] = []
        starts: list[int] = []
        cu: list[int] = [0]
        ctx: list[int] = []
        rows: list[int] = []
        samp: list[int] = []
        total = 0
        max_ctx = 0
        for s in sched.seqs:
            seq, n, start = s.seq, s.num_new, s.start
            if input_ids is not None:
                ids.append(0)  # a placeholder: the token is still on the device
            elif n == 1:
                ids.append(seq.token_ids[start])
            else:
                ids.extend(seq.token_ids[start : start + n])
            starts.append(start)
            rows.append(self._row_of(seq))
            total += n
            cu.append(total)
            ctx.append(start + n)
            if s.samples:
                samp.append(total - 1)
            max_ctx = max(max_ctx, start + n)
        bs = self.block_size
        decode = total == len(starts)  # pure decode: one token per sequence, its slot read off the block list
        slots = [s.seq.block_table[s.start // bs] * bs + s.start % bs for s in sched.seqs] if decode else []
        parts = (ids, starts, cu, ctx, rows, samp, slots)
        ids_t, starts_t, cu_t, ctx_t, rows_t, samp_t, slots_t = torch.split(
            torch.tensor([x for part in parts for x in part], dtype=torch.int64), [len(part) for part in parts])
        mb = blocks_for(max_ctx, bs)
        bt = self._bt.index_select(0, rows_t)[:, :mb]
        if decode:
            positions = starts_t
        else:
            lens_t = cu_t[1:] - cu_t[:-1]
            seq_idx = torch.repeat_interleave(torch.arange(len(starts)), lens_t)
            positions = torch.arange(total, dtype=torch.int64) - cu_t[:-1][seq_idx] + starts_t[seq_idx]
            slots_t = bt[seq_idx, positions // bs] * bs + positions % bs
        if input_ids is not None:
            if not decode or input_ids.numel() != len(starts):
                raise ValueError(f"device input ids are for decode steps: {input_ids.numel()} ids, {len(starts)} "
                                 f"sequences, {total} tokens")
            ids_t = input_ids
        return StepInputs(
            input_ids=ids_t,
            positions=positions,
            cu_seqlens=cu_t,
            context_lens=ctx_t,
            slot_mapping=slots_t,
            block_tables=bt,
            sample_idx=samp_t,
        )

    # ---- every rank: run the model ----------------------------------------------------------
    def warm_up(self, max_ctx: int, max_tokens: int = 0) -> int:
        """Build the kernels' per-shape plans and compile their size variants in this thread, the one that
        will run `execute` (`DeepseekV3ForCausalLM.warm_up`); the decode attention runs on the first
        layer's cache."""
        return self.model.warm_up(max_ctx, max_tokens, self.kv_caches[0] if self.kv_caches else None)

    @torch.inference_mode()
    def execute(self, inp: StepInputs) -> torch.Tensor | None:
        """Logits [n, vocab] (float32) for the sampled rows, or None when no row samples."""
        dev = self.device
        n = inp.input_ids.numel()
        if self.graphs is not None and n == inp.context_lens.numel() == inp.sample_idx.numel() \
                and self.graphs.bucket(n) is not None:  # pure decode, every row sampled
            return self.graphs.run(inp.input_ids, inp.positions, inp.slot_mapping, inp.context_lens,
                                   inp.block_tables)  # host tensors (rank 0) are staged and uploaded by the graphs
        if dev.type != "cpu":
            inp = StepInputs(*(t.to(dev, non_blocking=True) for t in (
                inp.input_ids, inp.positions, inp.cu_seqlens, inp.context_lens,
                inp.slot_mapping, inp.block_tables, inp.sample_idx)))
        meta = AttentionMetadata(
            cu_seqlens_q=inp.cu_seqlens,
            context_lens=inp.context_lens,
            slot_mapping=inp.slot_mapping,
            block_tables=inp.block_tables,
            block_size=self.block_size,
        )
        hidden = self.model(inp.input_ids, inp.positions, meta, self.kv_caches)
        if inp.sample_idx.numel() == 0:
            return None
        return self.model.compute_logits(hidden[inp.sample_idx])

    @torch.inference_mode()
    def sample_launch(self, logits: torch.Tensor | None, sched: SchedulerOutput) -> SampledTokens:
        """Sample the step's rows on the device and start their copy to the host, without waiting for it."""
        seqs = [s.seq for s in sched.seqs if s.samples]
        if logits is None or not seqs:
            return SampledTokens(None)
        toks = sample_tensor(logits, seqs)
        if toks.device.type != "cuda":
            return SampledTokens(toks, toks)
        host = torch.empty(toks.shape, dtype=toks.dtype, pin_memory=True)
        host.copy_(toks, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return SampledTokens(toks, host, ready)

    def wait_tokens(self, sampled: SampledTokens) -> list[int]:
        """The sampled tokens as Python ints, once their copy has arrived."""
        if sampled.host is None:
            return []
        if sampled.ready is not None:
            sampled.ready.synchronize()
        return sampled.host.tolist()

    def sample(self, logits: torch.Tensor | None, sched: SchedulerOutput) -> list[int]:
        return self.wait_tokens(self.sample_launch(logits, sched))


# the KV dtype as a number, for rank 0 to send to the TP workers (build.py sends, distributed.py receives)
KV_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float8_e4m3fn: 3}
KV_DTYPES = {v: k for k, v in KV_CODES.items()}


def make_runner(model, cfg, *, num_blocks: int, block_size: int, kv_code: int, max_model_len: int,
                max_rows: int, device: str, cuda_graphs: bool = False) -> ModelRunner:
    return ModelRunner(model, cfg, num_blocks=num_blocks, block_size=block_size, kv_dtype=KV_DTYPES[kv_code],
                       max_model_len=max_model_len, max_rows=max_rows, device=device, cuda_graphs=cuda_graphs)
