"""Attention metadata: the contract between the runtime (scheduler/runner) and the model.

One forward step runs a flat batch of T new tokens from B sequences, in batch order; a
sequence contributes one token when decoding or a chunk of its prompt when prefilling,
and prefill chunks and decodes may share a step. The latent KV cache of each layer is one
tensor [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim] (the compressed latent
followed by the rope key); the runtime owns the block tables, the model only reads and
writes the slots it is told to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    cu_seqlens_q: torch.Tensor  # int32/int64 [B+1]: new tokens of sequence b are [cu[b], cu[b+1]) of the flat batch
    context_lens: torch.Tensor  # int64 [B]: tokens of sequence b in the cache after this step (old + new)
    slot_mapping: torch.Tensor  # int64 [T]: flat cache slot (block * block_size + offset) for each new token
    block_tables: torch.Tensor  # int64 [B, max_blocks]: physical block ids of each sequence, padded with 0
    block_size: int

    @property
    def num_seqs(self) -> int:
        return int(self.context_lens.shape[0])
