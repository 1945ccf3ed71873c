"""A stand-in model that honours the runtime/model contract (engine/model/attn_meta.py) exactly.

Each layer's cache slot of a token gets (token id, position). The "next token" of a sequence is
a hash of every (id, position) it can read back from its cache through the block table, so a
wrong slot mapping, block table, context length or recomputation after preemption changes the
output. `reference_next` computes the same hash from the plain token list.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from k2bench.engine.model.attn_meta import AttentionMetadata


def reference_next(tokens: list[int], vocab: int) -> int:
    return sum(t * (i + 1) for i, t in enumerate(tokens)) % vocab


@dataclass
class FakeConfig:
    vocab_size: int = 101
    kv_cache_dim: int = 4
    num_hidden_layers: int = 2
    eos_token_id: int = 100
    max_position_embeddings: int = 4096


class FakeModel:
    def __init__(self, cfg: FakeConfig | None = None):
        self.cfg = cfg or FakeConfig()
        self.calls: list[int] = []  # tokens per forward

    def __call__(self, input_ids, positions, meta: AttentionMetadata, kv_caches):
        v = self.cfg.vocab_size
        t = input_ids.shape[0]
        self.calls.append(t)
        for cache in kv_caches:
            flat = cache.view(-1, cache.shape[-1])
            flat[meta.slot_mapping, 0] = input_ids.to(cache.dtype)
            flat[meta.slot_mapping, 1] = positions.to(cache.dtype)
        out = torch.zeros(t, v)
        cu = meta.cu_seqlens_q.tolist()
        bs = meta.block_size
        for b in range(meta.num_seqs):
            ctx = int(meta.context_lens[b])
            q = torch.arange(ctx)
            slots = meta.block_tables[b, q // bs] * bs + q % bs
            for cache in kv_caches:
                flat = cache.view(-1, cache.shape[-1])
                if not torch.equal(flat[slots, 1].double(), q.double()):
                    raise AssertionError("cache does not hold the positions the block table points to")
            flat = kv_caches[-1].view(-1, kv_caches[-1].shape[-1])
            acc = torch.cumsum(flat[slots, 0].double() * (q + 1).double(), 0)
            for i in range(cu[b], cu[b + 1]):
                p = int(positions[i])
                out[i, int(acc[p].item()) % v] = 1.0
        return out

    def compute_logits(self, hidden):
        return hidden.float() * 20.0
