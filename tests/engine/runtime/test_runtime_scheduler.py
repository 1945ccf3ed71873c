"""Scheduler and block manager, driven without a model."""

from __future__ import annotations

import pytest

from k2bench.engine.runtime.block_manager import BlockManager
from k2bench.engine.runtime.runtime_config import RuntimeConfig
from k2bench.engine.runtime.scheduler import Scheduler
from k2bench.engine.runtime.sequence import SamplingParams, SeqStatus, Sequence

pytestmark = pytest.mark.engine


def make(num_blocks=64, block_size=4, **kw) -> Scheduler:
    cfg = RuntimeConfig(block_size=block_size, max_model_len=kw.pop("max_model_len", 256), kv_watermark=0, **kw)
    return Scheduler(cfg, BlockManager(num_blocks, block_size), eos_token_ids=(0,))


def seq(n, max_tokens=8, t=0.0, **kw) -> Sequence:
    return Sequence(list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens, **kw), arrival_time=t)


def run_step(s: Scheduler, now: float, token: int = 7):
    out = s.schedule(now)
    s.postprocess(out, [token] * sum(x.samples for x in out.seqs))
    return out


def test_block_manager_grows_and_frees():
    bm = BlockManager(4, 8)
    a = seq(3)
    bm.grow(a, 9)
    assert len(a.block_table) == 2 and bm.num_free == 2
    bm.grow(a, 16)  # still two blocks
    assert len(a.block_table) == 2
    assert not bm.can_fit(a, 33)
    with pytest.raises(RuntimeError):
        bm.grow(a, 33)
    bm.free(a)
    assert bm.num_free == 4 and a.block_table == [] and bm.usage == 0.0


def test_admits_all_within_limits_and_respects_max_num_seqs():
    s = make(max_num_seqs=2, max_num_batched_tokens=100)
    for _ in range(3):
        s.add(seq(5))
    out = s.schedule(0.0)
    assert [x.num_new for x in out.seqs] == [5, 5]
    assert len(s.running) == 2 and len(s.waiting) == 1
    assert all(x.samples for x in out.seqs)


def test_chunked_prefill_respects_token_budget():
    s = make(max_num_batched_tokens=16)
    a = seq(40, max_tokens=4)
    s.add(a)
    chunks = []
    while a.num_output_tokens == 0:
        out = run_step(s, 0.0)
        chunks.append([x.num_new for x in out.seqs])
    assert chunks == [[16], [16], [8]]
    b = seq(30)
    s.add(b)
    out = run_step(s, 0.0)  # a decodes (1 token), b gets the remaining 15 of the budget
    assert [(x.seq, x.num_new) for x in out.seqs] == [(a, 1), (b, 15)]
    assert out.num_tokens == 16 and out.num_prefill_tokens == 15


def test_delay_factor_holds_new_prefills_until_oldest_waited_long_enough():
    s = make(scheduler_delay_factor=0.5, max_num_batched_tokens=100)
    first = seq(5, max_tokens=50, t=0.0)
    s.add(first)
    assert len(run_step(s, 0.0).seqs) == 1  # nothing running: admitted at once
    s.last_prefill_latency = 1.0
    late = seq(5, t=10.0)
    s.add(late)
    assert [x.seq for x in run_step(s, 10.3).seqs] == [first]  # waited 0.3 s <= 0.5 x 1.0
    assert late.status is SeqStatus.WAITING
    assert [x.seq for x in run_step(s, 10.6).seqs] == [first, late]  # waited 0.6 s > 0.5


def test_without_delay_factor_new_prefills_join_at_once():
    s = make(scheduler_delay_factor=0.0, max_num_batched_tokens=100)
    first = seq(5, max_tokens=50)
    s.add(first)
    run_step(s, 0.0)
    s.last_prefill_latency = 100.0
    late = seq(5, t=10.0)
    s.add(late)
    assert [x.seq for x in run_step(s, 10.0).seqs] == [first, late]


def test_preemption_frees_newest_and_resumes_with_recompute():
    # 6 blocks of 4 tokens; two sequences of 8 prompt tokens need 2 blocks each, then grow.
    s = make(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    a, b = seq(8, max_tokens=10), seq(8, max_tokens=10)
    s.add(a)
    s.add(b)
    preempted_at = None
    step = 0
    while s.has_work and step < 100:
        out = run_step(s, float(step))
        if out.preempted and preempted_at is None:
            preempted_at = step
            assert out.preempted == [b] and b.status is SeqStatus.WAITING
            assert b.num_computed == 0 and b.block_table == [] and s.waiting[0] is b
            resumed_len = b.num_tokens
        step += 1
    assert preempted_at is not None
    assert a.finish_reason == "length" and b.finish_reason == "length"
    assert a.num_output_tokens == 10 and b.num_output_tokens == 10
    assert s.blocks.num_free == 6
    assert b.num_preemptions == 1 and resumed_len > b.num_prompt_tokens


def test_resumed_sequence_recomputes_prompt_and_generated_tokens():
    s = make(num_blocks=5, block_size=4, max_num_batched_tokens=64)
    a, b = seq(8, max_tokens=8), seq(8, max_tokens=8)
    s.add(a)
    s.add(b)
    fed = []
    while s.has_work:
        out = run_step(s, 0.0)
        fed.extend((x.seq, x.start, x.num_new) for x in out.seqs if x.seq is b)
    restarts = [(start, n) for q, start, n in fed if start == 0]
    assert len(restarts) == 2  # the first prefill and the recomputation
    assert restarts[1][1] > 8  # the recomputation covers generated tokens too


def test_stop_rules_eos_min_tokens_ignore_eos_and_abort():
    s = make()
    a = seq(3, max_tokens=5)
    b = seq(3, max_tokens=5, min_tokens=2)
    c = seq(3, max_tokens=3, ignore_eos=True)
    for x in (a, b, c):
        s.add(x)
    run_step(s, 0.0, token=0)  # EOS id
    assert a.finish_reason == "stop" and a.num_output_tokens == 1
    assert not b.is_finished and not c.is_finished
    run_step(s, 0.0, token=0)
    assert b.finish_reason == "stop" and b.num_output_tokens == 2
    d = seq(3, max_tokens=5)
    s.add(d)
    s.abort(d)
    assert d.finish_reason == "abort" and not s.waiting
    while s.has_work:
        run_step(s, 0.0, token=0)
    assert c.finish_reason == "length" and c.num_output_tokens == 3
    assert s.blocks.num_free == 64


def test_rejects_requests_that_cannot_fit():
    s = make(num_blocks=4, block_size=4, max_model_len=64)
    with pytest.raises(ValueError, match="max_model_len"):
        s.add(seq(60, max_tokens=10))
    with pytest.raises(ValueError, match="KV cache"):
        s.add(seq(10, max_tokens=10))


def test_watermark_keeps_blocks_for_running_sequences():
    cfg = RuntimeConfig(block_size=4, max_model_len=256, kv_watermark=0.25)
    s = Scheduler(cfg, BlockManager(8, 4))
    a, b = seq(16), seq(12)
    s.add(a)
    s.add(b)
    out = s.schedule(0.0)
    assert [x.seq for x in out.seqs] == [a]  # b's 3 blocks would leave fewer than 2 of the 4 free


def test_a_request_needing_the_whole_cache_is_admitted_when_alone():
    cfg = RuntimeConfig(block_size=4, max_model_len=400, kv_watermark=0.1)
    s = Scheduler(cfg, BlockManager(10, 4))
    a = seq(36, max_tokens=4)  # 40 tokens = all 10 blocks; the watermark would keep one free
    s.add(a)
    out = s.schedule(0.0)
    assert [x.seq for x in out.seqs] == [a]
