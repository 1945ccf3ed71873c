"""Prefix caching in the block manager and the step loop, on the contract-honouring fake model.

The fake model's next token is a hash of every (token id, position) it reads back through the block
table, so a block shared with the wrong content, at the wrong position, or read before it was written
changes the output; `reference_next` gives the right answer from the plain token list.
"""

from __future__ import annotations

import random

import pytest
import torch
from runtime_fakes import FakeConfig, FakeModel, reference_next

from k2bench.engine.runtime.block_manager import BlockManager
from k2bench.engine.runtime.engine import LLMEngine
from k2bench.engine.runtime.runner import ModelRunner
from k2bench.engine.runtime.runtime_config import RuntimeConfig
from k2bench.engine.runtime.scheduler import Scheduler
from k2bench.engine.runtime.sequence import SamplingParams, Sequence

pytestmark = pytest.mark.engine

VOCAB = FakeConfig().vocab_size


def expected(prompt: list[int], n: int) -> list[int]:
    toks = list(prompt)
    for _ in range(n):
        toks.append(reference_next(toks, VOCAB))
    return toks[len(prompt):]


def build(num_blocks: int, block_size: int, budget: int, *, caching: bool, max_num_seqs: int = 64):
    model = FakeModel(FakeConfig())
    cfg = RuntimeConfig(block_size=block_size, max_model_len=512, max_num_batched_tokens=budget,
                        max_num_seqs=max_num_seqs, kv_watermark=0, enable_prefix_caching=caching)
    runner = ModelRunner(model, model.cfg, num_blocks=num_blocks, block_size=block_size, kv_dtype=torch.float32,
                         max_model_len=512, max_rows=max_num_seqs)
    sched = Scheduler(cfg, BlockManager(num_blocks, block_size, enable_caching=caching),
                      eos_token_ids=(model.cfg.eos_token_id,))
    return LLMEngine(runner, sched), model


def greedy(prompt: list[int], n: int) -> Sequence:
    return Sequence(list(prompt), SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))


def computed(bm: BlockManager, seq: Sequence) -> None:
    """Pretend a step computed all of `seq`'s tokens (what the scheduler's postprocess records)."""
    seq.num_computed = seq.num_tokens
    bm.commit(seq)


def consistent(bm: BlockManager) -> bool:
    """Every key names one cached block and back; a free block is held by nobody and sits in the pool
    its content says (cached or not); no block is both free and held."""
    assert all(bm._key_of[b] == k for k, b in bm._block_of.items()) and len(bm._key_of) == len(bm._block_of)
    assert all(b in bm._key_of and bm._ref[b] == 0 for b in bm._idle)
    assert all(b not in bm._key_of and bm._ref[b] == 0 for b in bm._empty)
    free = set(bm._idle) | set(bm._empty)
    assert len(free) == bm.num_free
    assert all((bm._ref[b] == 0) == (b in free) for b in range(bm.num_blocks))
    return True


# ---- the block manager alone -------------------------------------------------------------------
def test_a_block_is_found_only_under_the_same_whole_prefix():
    bm = BlockManager(16, 4, enable_caching=True)
    a = Sequence(list(range(1, 13)))  # three full blocks
    assert bm.allocate(a) == 0
    computed(bm, a)
    # same second block, different first block: the chained key differs, so nothing is shared
    b = Sequence([99, 2, 3, 4, 5, 6, 7, 8, 50])
    assert bm.allocate(b) == 0 and not set(b.block_table) & set(a.block_table)
    # same first two blocks, then different: two blocks shared, the rest new
    c = Sequence(list(range(1, 9)) + [70, 71])
    assert bm.allocate(c) == 8 and c.num_computed == 8
    assert c.block_table[:2] == a.block_table[:2] and c.block_table[2] not in a.block_table
    assert bm.num_free == 16 - 3 - 3 - 1  # a: 3, b: 3, c: one new


def test_the_last_token_is_always_computed_so_a_fully_cached_prompt_reuses_one_block_less():
    bm = BlockManager(16, 4, enable_caching=True)
    a = Sequence(list(range(1, 9)))
    bm.allocate(a)
    computed(bm, a)
    same = Sequence(list(range(1, 9)))  # block-aligned and wholly cached
    assert bm.allocate(same) == 4
    assert same.block_table[0] == a.block_table[0] and same.block_table[1] != a.block_table[1]
    one_more = Sequence(list(range(1, 10)))  # one token past the cached blocks: both reused
    assert bm.allocate(one_more) == 8


def test_blocks_are_not_findable_before_their_step_ran_and_partial_blocks_never():
    bm = BlockManager(16, 4, enable_caching=True)
    a = Sequence(list(range(1, 11)))
    bm.allocate(a)
    assert bm.allocate(Sequence(list(range(1, 11)))) == 0  # nothing computed yet
    a.num_computed = 6  # a chunk ended inside the second block
    bm.commit(a)
    assert bm.num_cached == 1
    assert bm.allocate(Sequence(list(range(1, 11)))) == 4


def test_free_blocks_keep_their_content_and_are_evicted_least_recently_released_first():
    bm = BlockManager(6, 2, enable_caching=True)
    old, new = Sequence([1, 2, 3, 4, 5]), Sequence([7, 8, 9, 10, 11])
    for s in (old, new):
        bm.allocate(s)
        computed(bm, s)
    old_blocks, new_blocks = list(old.block_table), list(new.block_table)
    bm.free(old)
    bm.free(new)
    assert bm.num_free == 6 and bm.num_cached == 4 and bm.usage == 0.0
    # one uncached block of each went to the front of the queue: they go first, then old's chain, tail first
    x = Sequence([40, 41, 42, 43, 44])  # needs 3 blocks: both uncached, then old's second block
    bm.allocate(x)
    assert set(x.block_table[:2]) == {old_blocks[2], new_blocks[2]} and x.block_table[2] == old_blocks[1]
    assert bm.num_evicted == 1
    bm.free(x)  # its blocks hold nothing cached: they are handed out next, ahead of new's chain
    # old's first block survived; new's whole chain did
    again = Sequence([1, 2, 3, 4, 5])
    assert bm.allocate(again) == 2 and again.block_table[0] == old_blocks[0]
    bm.free(again)
    assert bm.allocate(Sequence([7, 8, 9, 10, 11])) == 4 and bm.num_evicted == 1


def test_blocks_a_sequence_holds_are_never_evicted_and_shared_blocks_are_counted():
    bm = BlockManager(4, 2, enable_caching=True)
    a = Sequence([1, 2, 3, 4, 5])
    bm.allocate(a)
    computed(bm, a)
    b = Sequence([1, 2, 3, 4, 6])
    assert bm.allocate(b) == 4 and bm.num_free == 0  # 3 + 1: the two full blocks are shared
    assert bm.allocate(Sequence([9, 9, 9])) is None  # nothing free, and held blocks are not taken
    bm.free(a)
    assert bm.num_free == 1  # only a's own last block: the shared ones are still held by b
    bm.free(b)
    assert bm.num_free == 4 and bm.num_evicted == 0
    # admission counts idle cached blocks it takes out of the free queue
    c = Sequence([1, 2, 3, 4, 8, 8, 8, 8, 8])
    assert bm.allocate(c, reserve=1) is None  # 2 cached + 3 new + 1 reserve > 4
    assert bm.allocate(c) is None
    assert bm.num_free == 4 and c.block_table == []


def test_caching_off_shares_nothing():
    bm = BlockManager(8, 2)
    a = Sequence([1, 2, 3, 4, 5])
    bm.allocate(a)
    computed(bm, a)
    b = Sequence([1, 2, 3, 4, 5])
    assert bm.allocate(b) == 0 and not set(a.block_table) & set(b.block_table)
    assert bm.num_cached == 0


# ---- the engine loop ---------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [4, 5])
def test_cached_prefixes_give_the_reference_tokens_and_the_counts_the_prompts_imply(block_size):
    """Prompts sharing prefixes of several lengths (block-aligned and not), run one after another so
    each finds the earlier ones' blocks; cached_tokens is whole blocks of the shared prefix."""
    eng, model = build(200, block_size, 4096, caching=True)
    rng = random.Random(3)
    base = [rng.randrange(1, 100) for _ in range(60)]
    first = greedy(base[:40], 5)
    eng.generate([first])
    assert first.num_cached_tokens == 0
    for shared in (3, 4, 5, 8, 13, 20, 39, 40):
        p = base[:shared] + [rng.randrange(1, 100) for _ in range(7)]
        s = greedy(p, 6)
        calls = len(model.calls)
        eng.generate([s])
        assert s.output_token_ids == expected(p, 6), shared
        want = min(shared, len(p) - 1) // block_size * block_size
        assert s.num_cached_tokens == want, shared
        assert model.calls[calls] == len(p) - want  # the prefill ran only the uncached tokens
    assert eng.stats.prefix_cache_hits == sum(n // block_size * block_size for n in (3, 4, 5, 8, 13, 20, 39, 40))
    again = greedy(base[:40], 5)  # the first prompt again, block-aligned: its last block is recomputed
    eng.generate([again])
    assert again.output_token_ids == first.output_token_ids == expected(base[:40], 5)
    assert again.num_cached_tokens == 40 - block_size
    assert eng.scheduler.blocks.num_free == 200


@pytest.mark.parametrize("num_blocks,budget,preempts", [(28, 16, True), (26, 7, False), (40, 64, True)])
def test_fuzz_many_sessions_in_a_small_cache(num_blocks, budget, preempts):
    """Conversations that resend their history, over a cache too small to keep it all: eviction happens
    (and preemption, where the budget lets enough sequences run at once), every output is the reference,
    the bookkeeping stays consistent after every step, and every block comes back."""
    bs = 4
    eng, _ = build(num_blocks, bs, budget, caching=True, max_num_seqs=6)
    rng = random.Random(num_blocks)
    systems = [[rng.randrange(1, 100) for _ in range(rng.randrange(3, 14))] for _ in range(3)]
    histories = [list(rng.choice(systems)) for _ in range(10)]
    checked = 0
    for _turn in range(4):
        batch = []
        for h in histories:
            h.extend(rng.randrange(1, 100) for _ in range(rng.randrange(1, 9)))
            batch.append((h, greedy(h, rng.randrange(1, 11))))
        rng.shuffle(batch)
        for _, s in batch:
            eng.add(s)
        while eng.has_work:
            eng.step()
            assert consistent(eng.scheduler.blocks)
        for h, s in batch:
            assert s.output_token_ids == expected(h, s.params.max_tokens)
            h.extend(s.output_token_ids)  # the next turn resends the answer
            checked += 1
        bm = eng.scheduler.blocks
        assert bm.num_free == num_blocks and bm.usage == 0.0
        assert consistent(bm)
    assert checked == 40
    assert eng.stats.prefix_cache_hits > 0
    assert eng.scheduler.blocks.num_evicted > 0
    assert (eng.scheduler.num_preemptions > 0) == preempts


def test_outputs_with_caching_on_and_off_are_identical_under_preemption():
    rng = random.Random(9)
    prefix = [rng.randrange(1, 100) for _ in range(17)]
    ps = [prefix[: rng.randrange(0, 18)] + [rng.randrange(1, 100) for _ in range(rng.randrange(1, 12))]
          for _ in range(30)]
    outs = {}
    for caching in (False, True):
        eng, _ = build(14, 4, 24, caching=caching, max_num_seqs=8)
        seqs = [greedy(p, 10) for p in ps]
        eng.generate(seqs)
        outs[caching] = [s.output_token_ids for s in seqs]
        assert eng.scheduler.num_preemptions > 0
        assert eng.scheduler.blocks.num_free == 14
    assert outs[True] == outs[False] == [expected(p, 10) for p in ps]


def test_caching_off_counts_queries_and_no_hits():
    eng, _ = build(64, 4, 256, caching=False)
    p = list(range(1, 30))
    seqs = [greedy(p, 3), greedy(p, 3)]
    eng.generate(seqs[:1])
    eng.generate(seqs[1:])
    assert eng.stats.prompt_tokens == 2 * len(p) and eng.stats.prefix_cache_hits == 0
    assert [s.num_cached_tokens for s in seqs] == [0, 0]


def test_the_serve_flag_reaches_the_runtime_config_and_the_default_is_off():
    from k2bench.harness.cli import build_parser

    assert RuntimeConfig().enable_prefix_caching is False
    parse = build_parser().parse_args
    assert parse(["serve", "--model", "m", "--enable-prefix-caching"]).enable_prefix_caching is True
    assert parse(["serve", "--model", "m", "--no-enable-prefix-caching"]).enable_prefix_caching is False
    assert parse(["serve", "--model", "m"]).enable_prefix_caching is None  # the config's default
