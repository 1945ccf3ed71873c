"""Steps launched ahead (async scheduling): the same tokens as one step at a time, and nothing leaked.

The fake model's next token hashes every (id, position) a sequence reads back from its cache, so a
step launched ahead with a wrong input id, slot or block table changes every later token. Each case
runs the same requests with `async_scheduling` on and off and compares them with the plain-list
reference; `steps_ahead` shows that the overlapped path really ran.
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


def build(overlap: bool, *, num_blocks=400, block_size=8, budget=2048, max_num_seqs=64, caching=False):
    model = FakeModel(FakeConfig())
    cfg = RuntimeConfig(block_size=block_size, max_model_len=512, max_num_batched_tokens=budget,
                        max_num_seqs=max_num_seqs, kv_watermark=0, async_scheduling=overlap,
                        enable_prefix_caching=caching)
    runner = ModelRunner(model, model.cfg, num_blocks=num_blocks, block_size=block_size, kv_dtype=torch.float32,
                         max_model_len=512, max_rows=max_num_seqs)
    blocks = BlockManager(num_blocks, block_size, enable_caching=caching)
    return LLMEngine(runner, Scheduler(cfg, blocks, eos_token_ids=(model.cfg.eos_token_id,)))


def reference(prompt, max_tokens, stop=()):
    toks = list(prompt)
    for _ in range(max_tokens):
        toks.append(reference_next(toks, 101))
        if toks[-1] in stop:
            break
    return toks[len(prompt):]


def prompts(k, lo=3, hi=40, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(1, 100) for _ in range(rng.randrange(lo, hi))] for _ in range(k)]


def run_both(make_seqs, **kw):
    out = {}
    for overlap in (False, True):
        eng = build(overlap, **kw)
        seqs = make_seqs()
        eng.generate(seqs)
        assert not eng.has_work
        assert eng.scheduler.blocks.num_free == eng.scheduler.blocks.num_blocks  # every block back
        assert not eng.runner._row  # every block-table row back
        out[overlap] = (seqs, eng)
    return out


@pytest.mark.parametrize("num_blocks,block_size,budget,max_num_seqs", [
    (400, 8, 2048, 64),  # everything fits: after the prefills, every step is launched ahead
    (40, 4, 24, 64),  # chunked prefill and preemptions in between
    (400, 8, 2048, 3),  # requests wait for a free batch slot while the running ones decode ahead
])
def test_lengths_differ_chunks_and_preemption(num_blocks, block_size, budget, max_num_seqs):
    ps = prompts(10)
    lens = [1 + (7 * i) % 15 for i in range(len(ps))]  # requests end at different steps: rows drop out ahead

    def make():
        return [Sequence(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)) for p, n in zip(ps, lens, strict=True)]

    res = run_both(make, num_blocks=num_blocks, block_size=block_size, budget=budget, max_num_seqs=max_num_seqs)
    for overlap, (seqs, eng) in res.items():
        for p, n, s in zip(ps, lens, seqs, strict=True):
            assert s.output_token_ids == reference(p, n), (overlap, s.seq_id)
            assert s.finish_reason == "length"
        assert (eng.stats.steps_ahead > 0) == overlap
    on, off = res[True][1].stats, res[False][1].stats
    assert on.generation_tokens == off.generation_tokens == sum(lens)
    if num_blocks < 100:
        assert res[True][1].scheduler.num_preemptions > 0
    elif max_num_seqs >= len(ps):  # one step prefills every prompt; each step after it is launched ahead
        assert on.steps == off.steps == max(lens) and on.steps_ahead == on.steps - 1


def test_a_stop_token_ends_a_request_whose_next_step_is_already_launched():
    """The step after the stop token was launched before the stop was read: its row is computed and dropped."""
    ps = prompts(6, seed=3)
    # each request stops on its own 5th reference token, so a step with its row is always in flight then
    stops = [reference(p, 5)[4] for p in ps]

    def make():
        return [Sequence(p, SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[t], ignore_eos=True))
                for p, t in zip(ps, stops, strict=True)]

    res = run_both(make)
    for overlap, (seqs, _eng) in res.items():
        for p, t, s in zip(ps, stops, seqs, strict=True):
            assert s.output_token_ids == reference(p, 30, stop=(t,)), overlap
            assert s.finish_reason == "stop" and len(s.output_token_ids) <= 5
    on = res[True][1].stats
    assert on.steps_ahead > 0
    # the ahead rows of stopped requests are not counted as tokens
    assert on.generation_tokens == sum(len(s.output_token_ids) for s in res[True][0])


def test_abort_while_its_next_step_is_in_flight():
    eng = build(True)
    ps = prompts(4, seed=5)
    seqs = [Sequence(p, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)) for p in ps]
    for s in seqs:
        eng.add(s)
    while eng._ahead is None:  # run until a step has been launched ahead of reading the last one
        eng.step()
    victim = seqs[1]
    assert any(x.seq is victim for x in eng._ahead.sched.seqs)
    had = len(victim.output_token_ids)
    eng.abort(victim)
    while eng.has_work:
        eng.step()
    assert victim.finish_reason == "abort" and len(victim.output_token_ids) == had
    assert victim.output_token_ids == reference(ps[1], 20)[:had]
    for i in (0, 2, 3):
        assert seqs[i].output_token_ids == reference(ps[i], 20)
    assert eng.scheduler.blocks.num_free == eng.scheduler.blocks.num_blocks
    assert not eng.runner._row


def test_seeded_sampling_gives_the_same_tokens_with_and_without_overlap():
    ps = prompts(5, seed=9)

    def make():
        return [Sequence(p, SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=100 + i, max_tokens=12,
                                           ignore_eos=True))
                for i, p in enumerate(ps)]

    res = run_both(make)
    assert [s.output_token_ids for s in res[True][0]] == [s.output_token_ids for s in res[False][0]]
    assert res[True][1].stats.steps_ahead > 0


def test_prefix_caching_with_steps_ahead():
    """A block a step ahead writes into is never findable by another request before it is full."""
    shared = prompts(1, lo=24, hi=25, seed=2)[0]
    tails = prompts(6, lo=2, hi=9, seed=4)

    def make():
        return [Sequence(shared + t, SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)) for t in tails]

    res = run_both(make, caching=True, max_num_seqs=2)
    for overlap, (seqs, eng) in res.items():
        for t, s in zip(tails, seqs, strict=True):
            assert s.output_token_ids == reference(shared + t, 9), overlap
        assert eng.stats.prefix_cache_hits > 0
    assert res[True][1].stats.steps_ahead > 0


def test_the_switch_reaches_the_cli_and_tensor_parallelism_turns_it_off():
    from k2bench.harness.cli import build_parser

    assert RuntimeConfig().async_scheduling is True
    assert build_parser().parse_args(["serve", "--model", "m", "--no-async-scheduling"]).async_scheduling is False
    assert build_parser().parse_args(["serve", "--model", "m"]).async_scheduling is None  # the config default
    eng = build(True)
    assert eng.overlaps
    eng.comm = object()  # a tensor-parallel broadcaster: workers read inputs from rank 0's host
    assert not eng.overlaps
