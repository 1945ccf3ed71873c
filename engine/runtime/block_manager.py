"""Hands out fixed-size blocks of the paged latent KV cache to sequences.

No prefix sharing: each block belongs to exactly one sequence, so a free list is all we need.
The cache tensors themselves live in the runner; this class only does the bookkeeping.
"""

from __future__ import annotations

from collections import deque

from k2bench.engine.runtime.sequence import Sequence


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token (got {num_blocks} x {block_size})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (the /metrics KV usage gauge)."""
        return 1.0 - len(self._free) / self.num_blocks

    def extra_blocks(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks `seq` still needs so that its first `num_tokens` tokens have slots."""
        return max(0, blocks_for(num_tokens, self.block_size) - len(seq.block_table))

    def can_fit(self, seq: Sequence, num_tokens: int, reserve: int = 0) -> bool:
        return self.extra_blocks(seq, num_tokens) + reserve <= len(self._free)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Give `seq` slots for its first `num_tokens` tokens (raises if there are not enough blocks)."""
        need = self.extra_blocks(seq, num_tokens)
        if need > len(self._free):
            raise RuntimeError(f"out of KV blocks: need {need}, {len(self._free)} free")
        free = self._free
        seq.block_table.extend(free.popleft() for _ in range(need))

    def free(self, seq: Sequence) -> None:
        self._free.extend(seq.block_table)
        seq.block_table = []
