"""Hostile sampling fields are refused before the engine sees them, and a step that fails anyway fails only
the requests it concerns (no server, no model: the parser and the engine loop on the fake model)."""

from __future__ import annotations

import pytest
import torch
from runtime_fakes import FakeConfig, FakeModel, reference_next

from k2bench.engine.runtime.block_manager import BlockManager
from k2bench.engine.runtime.engine import LLMEngine
from k2bench.engine.runtime.protocol import RequestError, parse_common
from k2bench.engine.runtime.runner import ModelRunner
from k2bench.engine.runtime.runtime_config import RuntimeConfig
from k2bench.engine.runtime.scheduler import Scheduler
from k2bench.engine.runtime.sequence import SamplingParams, Sequence

pytestmark = pytest.mark.engine

NAN = float("nan")
HOSTILE = [
    ({"top_k": 2**63}, "top_k"), ({"top_k": -2}, "top_k"), ({"top_k": "5"}, "top_k"),
    ({"temperature": NAN}, "temperature"), ({"temperature": -0.5}, "temperature"),
    ({"temperature": float("inf")}, "temperature"), ({"top_p": 1.5}, "top_p"), ({"top_p": NAN}, "top_p"),
    ({"seed": 2**64}, "seed"), ({"seed": -(2**63) - 1}, "seed"), ({"seed": True}, "seed"),
    ({"presence_penalty": NAN}, "presence_penalty"), ({"min_p": 0.5}, "min_p"),
    ({"repetition_penalty": 1.3}, "repetition_penalty"), ({"n": "2"}, "n"), ({"max_tokens": "9"}, "max_tokens"),
    ({"stop": ["x"] * 17}, "stop"), ({"stop": "y" * 5000}, "stop"), ({"stop_token_ids": [512]}, "stop_token_ids"),
    ({"stop_token_ids": [2**63]}, "stop_token_ids"), ({"min_tokens": -1}, "min_tokens"),
]


@pytest.mark.parametrize("field,param", HOSTILE, ids=[p for _, p in HOSTILE])
def test_each_out_of_range_sampling_field_is_a_400_naming_it(field, param):
    with pytest.raises(RequestError) as err:
        parse_common({"prompt": "hi", **field}, ("m",), 16, vocab_size=512)
    assert err.value.status == 400 and err.value.param == param


def test_in_range_extremes_are_accepted_and_a_top_k_past_the_vocabulary_means_off():
    req = parse_common({"top_k": 10**6, "seed": 2**63 - 1, "temperature": 100, "top_p": 1e-9, "min_p": 0},
                       ("m",), 16, vocab_size=512)
    assert req.params.top_k == 0 and req.params.seed == 2**63 - 1
    assert parse_common({"seed": -(2**63), "top_k": 511}, ("m",), 16, vocab_size=512).params.top_k == 511


def test_the_engine_itself_refuses_params_its_sampler_cannot_hold():
    eng, _ = _engine()
    for bad in (SamplingParams(top_k=2**63), SamplingParams(temperature=NAN), SamplingParams(seed=2**64),
                SamplingParams(top_p=0.0)):
        with pytest.raises(ValueError):
            eng.add(Sequence([1, 2, 3], bad))
    assert not eng.has_work


def _engine() -> tuple[LLMEngine, FakeModel]:
    model = FakeModel(FakeConfig())
    cfg = RuntimeConfig(block_size=8, max_model_len=256, max_num_batched_tokens=512, max_num_seqs=8, kv_watermark=0)
    runner = ModelRunner(model, model.cfg, num_blocks=64, block_size=8, kv_dtype=torch.float32, max_model_len=256,
                         max_rows=8)
    return LLMEngine(runner, Scheduler(cfg, BlockManager(64, 8), eos_token_ids=(100,))), model


def test_a_row_the_sampler_cannot_take_fails_alone_and_its_batch_mates_finish():
    """The finding: top_k = 2**63 reached the sampler and every request in its step died with it."""
    eng, _ = _engine()
    good = [Sequence([5, 6, 7, i], SamplingParams(temperature=0.7, seed=i, max_tokens=20, ignore_eos=True))
            for i in range(3)]
    bad = Sequence([9, 9, 9], SamplingParams(temperature=0.7, max_tokens=20, ignore_eos=True))
    for s in good[:2] + [bad] + good[2:]:
        eng.add(s)
    bad.params.top_k = 2**63  # past every check, as an unforeseen bug would be
    failed = []
    while eng.has_work:
        eng.step()
        failed.extend(eng.failed)
    assert [s for s, _ in failed] == [bad] and "engine step failed" in failed[0][1]
    assert bad.finish_reason == "abort"
    for s in good:
        assert s.finish_reason == "length" and s.num_output_tokens == 20
    assert eng.scheduler.blocks.num_free == eng.scheduler.blocks.num_blocks  # nothing leaked


def test_a_failed_forward_at_tp1_aborts_that_step_only_and_the_engine_serves_on(monkeypatch):
    eng, _ = _engine()
    first = Sequence([1, 2, 3], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    eng.add(first)

    def device_fault(self, *args):
        raise RuntimeError("device fault")

    with monkeypatch.context() as m:
        m.setattr(FakeModel, "__call__", device_fault)
        eng.step()
    assert [s for s, _ in eng.failed] == [first] and first.finish_reason == "abort"
    later = Sequence([4, 5, 6], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    eng.generate([later])
    want = [4, 5, 6]
    for _ in range(3):
        want.append(reference_next(want, 101))
    assert later.output_token_ids == want[3:]
