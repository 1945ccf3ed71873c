"""Hands out fixed-size blocks of the paged latent KV cache to sequences, and with prefix caching
lets sequences share the full blocks of a prefix they have in common.

Prefix caching (vLLM's automatic prefix caching, in this engine's terms): a block whose tokens have
all been computed gets a key, the SHA-256 of its parent block's key and its own token ids. Equal keys
therefore mean equal tokens at equal positions from the start of the sequence, which is all a latent
KV entry depends on, so any sequence with that prefix can read the block instead of computing it.
Each block counts the sequences holding it. A block no sequence holds is free; a free block keeps its
content and key until it is handed out again, and free blocks are handed out least recently released
first (blocks with no key before any cached one), so a cached block is evicted only when no free
block without content is left and never while a sequence holds it.

The cache tensors live in the runner; this class only does the bookkeeping. It runs on rank 0 only
(the scheduler's side); tensor-parallel workers receive the resulting block tables and slots.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque

from k2bench.engine.runtime.sequence import Sequence


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def chain_key(parent: bytes, tokens: list[int]) -> bytes:
    """The key of a full block: a cryptographic hash, so that two different prefixes never share KV."""
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token (got {num_blocks} x {block_size})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._ref = [0] * num_blocks  # sequences holding each block
        self._empty: deque[int] = deque(range(num_blocks))  # free blocks holding nothing cached: handed out first
        self._idle: OrderedDict[int, None] = OrderedDict()  # free cached blocks, least recently released first
        self._block_of: dict[bytes, int] = {}  # key -> the cached block holding it
        self._key_of: dict[int, bytes] = {}  # cached block -> its key
        self.num_evicted = 0  # cached blocks handed out for other content

    @property
    def num_free(self) -> int:
        """Blocks no sequence holds (cached ones included: they are handed out when needed)."""
        return len(self._empty) + len(self._idle)

    @property
    def num_cached(self) -> int:
        return len(self._key_of)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences (the /metrics KV usage gauge)."""
        return 1.0 - self.num_free / self.num_blocks

    def extra_blocks(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks `seq` still needs so that its first `num_tokens` tokens have slots."""
        return max(0, blocks_for(num_tokens, self.block_size) - len(seq.block_table))

    def can_fit(self, seq: Sequence, num_tokens: int, reserve: int = 0) -> bool:
        return self.extra_blocks(seq, num_tokens) + reserve <= self.num_free

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Give `seq` slots for its first `num_tokens` tokens (raises if there are not enough blocks)."""
        need = self.extra_blocks(seq, num_tokens)
        if need > self.num_free:
            raise RuntimeError(f"out of KV blocks: need {need}, {self.num_free} free")
        seq.block_table.extend(self._take() for _ in range(need))

    def allocate(self, seq: Sequence, reserve: int = 0) -> int | None:
        """Blocks for all of `seq`'s known tokens on admission, reusing the longest cached chain of full
        blocks of its prefix. Sets `seq.num_computed` to the tokens found and returns that number, or
        returns None (and changes nothing) when the blocks do not fit with `reserve` left free.

        At most (num_tokens - 1) tokens are reused, rounded down to whole blocks: the last token is
        always computed so that its logits exist, and a partly reused block would be written to while
        other sequences read it."""
        if seq.block_table:
            raise RuntimeError(f"sequence {seq.seq_id} already holds blocks")
        hits = self._lookup(seq) if self.enable_caching else []
        need = blocks_for(seq.num_tokens, self.block_size) - len(hits)
        idle_hits = sum(1 for b in hits if self._ref[b] == 0)  # they leave the free pool too
        if need + idle_hits + reserve > self.num_free:
            return None
        for b in hits:
            if self._ref[b] == 0:
                del self._idle[b]
            self._ref[b] += 1
        seq.block_table = hits + [self._take() for _ in range(need)]
        seq.num_committed_blocks = len(hits)
        seq.num_computed = len(hits) * self.block_size
        return seq.num_computed

    def commit(self, seq: Sequence) -> None:
        """Make the blocks `seq` has now fully computed findable by later sequences (after a step ran,
        so that no sequence can find a block before its KV is written)."""
        if not self.enable_caching:
            return
        full = min(seq.num_computed // self.block_size, len(seq.block_table))
        if full <= seq.num_committed_blocks:
            return
        keys = self._keys(seq, full)
        for i in range(seq.num_committed_blocks, full):
            b, key = seq.block_table[i], keys[i]
            # a block found in the cache is registered already; a key another block got first keeps that one
            if b not in self._key_of and key not in self._block_of:
                self._block_of[key] = b
                self._key_of[b] = key
        seq.num_committed_blocks = full

    def free(self, seq: Sequence) -> None:
        """Release `seq`'s blocks. The last block of a chain goes first into the free queue, so that
        eviction takes a prefix's tail before its head (a head without its tail is still useful)."""
        ref, cached = self._ref, self._key_of
        for b in reversed(seq.block_table):
            ref[b] -= 1
            if ref[b] == 0:
                if b in cached:
                    self._idle[b] = None
                else:  # nothing worth keeping: handed out before any cached block
                    self._empty.append(b)
        seq.block_table = []
        seq.num_committed_blocks = 0

    # ---- internals ----------------------------------------------------------------------------
    def _take(self) -> int:
        if self._empty:
            b = self._empty.popleft()
        else:  # evict the least recently released cached block
            b, _ = self._idle.popitem(last=False)
            del self._block_of[self._key_of.pop(b)]
            self.num_evicted += 1
        self._ref[b] = 1
        return b

    def _keys(self, seq: Sequence, n: int) -> list[bytes]:
        """The chain keys of `seq`'s first `n` full blocks (kept on the sequence: its tokens never change)."""
        keys, bs, tokens = seq.block_keys, self.block_size, seq.token_ids
        parent = keys[-1] if keys else b""
        for i in range(len(keys), n):
            parent = chain_key(parent, tokens[i * bs : (i + 1) * bs])
            keys.append(parent)
        return keys

    def _lookup(self, seq: Sequence) -> list[int]:
        """The cached blocks of the longest chain of `seq`'s full blocks found, from the first."""
        n = (seq.num_tokens - 1) // self.block_size
        hits: list[int] = []
        keys, bs, tokens = seq.block_keys, self.block_size, seq.token_ids
        parent = b""
        for i in range(n):
            if i < len(keys):
                key = keys[i]
            else:  # computed one at a time: a miss early on spares hashing the rest of a long prompt
                key = chain_key(parent, tokens[i * bs : (i + 1) * bs])
                keys.append(key)
            b = self._block_of.get(key)
            if b is None:
                break
            hits.append(b)
            parent = key
        return hits
