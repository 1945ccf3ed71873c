"""Runner + engine loop on a contract-honouring fake model: slots, block tables, preemption."""

from __future__ import annotations

import random

import pytest
import torch
from runtime_fakes import FakeConfig, FakeModel, reference_next

from k2bench.engine.runtime.block_manager import BlockManager
from k2bench.engine.runtime.engine import LLMEngine
from k2bench.engine.runtime.runner import ModelRunner, StepInputs
from k2bench.engine.runtime.runtime_config import RuntimeConfig
from k2bench.engine.runtime.scheduler import Scheduler
from k2bench.engine.runtime.sequence import SamplingParams, Sequence

pytestmark = pytest.mark.engine


def build(num_blocks, block_size, budget, max_num_seqs=64, kv_dtype=torch.float32):
    model = FakeModel(FakeConfig())
    cfg = RuntimeConfig(block_size=block_size, max_model_len=512, max_num_batched_tokens=budget,
                        max_num_seqs=max_num_seqs, kv_watermark=0)
    runner = ModelRunner(model, model.cfg, num_blocks=num_blocks, block_size=block_size, kv_dtype=kv_dtype,
                         max_model_len=512, max_rows=max_num_seqs)
    sched = Scheduler(cfg, BlockManager(num_blocks, block_size), eos_token_ids=(model.cfg.eos_token_id,))
    return LLMEngine(runner, sched), model


def expected(prompt, n, vocab=101):
    toks = list(prompt)
    for _ in range(n):
        toks.append(reference_next(toks, vocab))
    return toks[len(prompt):]


def prompts(k, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(1, 100) for _ in range(rng.randrange(3, 40))] for _ in range(k)]


@pytest.mark.parametrize("num_blocks,block_size,budget", [(400, 16, 2048), (40, 4, 24), (10, 8, 16), (9, 8, 7)])
def test_outputs_match_reference_under_chunking_and_preemption(num_blocks, block_size, budget):
    eng, model = build(num_blocks, block_size, budget)
    ps = prompts(12)
    seqs = [Sequence(p, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)) for p in ps]
    eng.generate(seqs)
    for p, s in zip(ps, seqs, strict=True):
        assert s.output_token_ids == expected(p, 12)
        assert s.finish_reason == "length"
    assert max(model.calls) <= budget
    assert eng.scheduler.blocks.num_free == num_blocks
    if num_blocks < 100:
        assert eng.scheduler.num_preemptions > 0  # the small pools really did preempt


def test_fp8_and_bf16_caches_store_and_read_back():
    # ids < 100 and positions < 64 are exact in bf16; fp8 e4m3 holds integers up to 16 exactly.
    for dtype, hi in ((torch.bfloat16, 100), (torch.float8_e4m3fn, 16)):
        eng, _ = build(64, 8, 256, kv_dtype=dtype)
        assert eng.runner.kv_caches[0].dtype == dtype
        p = [3, 1, 4, 1, 5, 9, 2, 6][: 8 if hi > 16 else 5]
        s = Sequence(p, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        eng.generate([s])
        assert s.output_token_ids == expected(p, 1)


def test_step_inputs_pack_roundtrip():
    eng, _ = build(64, 4, 64)
    for p in prompts(3):
        eng.add(Sequence(p, SamplingParams(temperature=0, max_tokens=3)))
    sched = eng.scheduler.schedule(0.0)
    inp = eng.runner.prepare(sched)
    header, body = inp.pack()
    assert body.numel() == StepInputs.body_len(header)
    back = StepInputs.unpack(header, body)
    for name in ("input_ids", "positions", "cu_seqlens", "context_lens", "slot_mapping", "block_tables", "sample_idx"):
        assert torch.equal(getattr(back, name), getattr(inp, name)), name


def test_max_num_seqs_bounds_each_batch():
    eng, _ = build(400, 16, 4096, max_num_seqs=3)
    seqs = [Sequence(p, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)) for p in prompts(7)]
    for s in seqs:
        eng.add(s)
    while eng.has_work:
        eng.step()
        assert len(eng.scheduler.running) <= 3
    assert all(s.num_output_tokens == 4 for s in seqs)


def test_host_threads_on_a_gpu_are_one_unless_the_user_set_them(monkeypatch):
    """A GPU rank builds step inputs on one host thread; OMP_NUM_THREADS, when set, wins; CPU ranks share
    the cores."""
    from k2bench.engine.runtime import distributed

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        torch.set_num_threads(2)
        distributed.set_host_threads("cuda", 1)
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        distributed.set_host_threads("cuda", 1)
        assert torch.get_num_threads() == 2
        monkeypatch.setattr(distributed.os, "cpu_count", lambda: 8)
        distributed.set_host_threads("cpu", 4)
        assert torch.get_num_threads() == 2  # 8 cores over 4 ranks
    finally:
        torch.set_num_threads(before)


def test_step_inputs_match_a_per_token_reference_in_mixed_and_decode_steps():
    """`prepare` builds its tensors from one packed list; every field must equal what the scheduler's output
    says token by token (ids, positions, cache slots off the block lists, offsets, sampled rows)."""
    eng, _ = build(64, 4, 24)
    for p in prompts(6, seed=3):
        eng.add(Sequence(p, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)))
    kinds = set()
    while eng.has_work:
        sched = eng.scheduler.schedule(0.0)
        for seq in sched.preempted:
            eng.runner.release(seq)
        if sched.empty:
            continue
        inp = eng.runner.prepare(sched)
        ids, pos, slots, cu, ctx, samp = [], [], [], [0], [], []
        for s in sched.seqs:
            for p in range(s.start, s.start + s.num_new):
                ids.append(s.seq.token_ids[p])
                pos.append(p)
                slots.append(s.seq.block_table[p // 4] * 4 + p % 4)
            cu.append(cu[-1] + s.num_new)
            ctx.append(s.start + s.num_new)
            if s.samples:
                samp.append(cu[-1] - 1)
        assert inp.input_ids.tolist() == ids
        assert inp.positions.tolist() == pos
        assert inp.slot_mapping.tolist() == slots
        assert inp.cu_seqlens.tolist() == cu
        assert inp.context_lens.tolist() == ctx
        assert inp.sample_idx.tolist() == samp
        for b, s in enumerate(sched.seqs):
            n = len(s.seq.block_table[: inp.block_tables.shape[1]])
            assert inp.block_tables[b, :n].tolist() == s.seq.block_table[:n]
        kinds.add("decode" if len(ids) == len(sched.seqs) else "mixed")
        logits = eng.runner.execute(inp)
        eng.scheduler.postprocess(sched, eng.runner.sample(logits, sched))
        for s in sched.seqs:
            if s.seq.is_finished:
                eng.runner.release(s.seq)
    assert kinds == {"decode", "mixed"}  # both paths of `prepare` were checked
