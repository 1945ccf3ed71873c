"""Sampler: greedy, seeded reproducibility, top-k / top-p masks, temperature."""

from __future__ import annotations

import pytest
import torch

from k2bench.engine.runtime.sampling import filter_logits, sample
from k2bench.engine.runtime.sequence import SamplingParams, Sequence

pytestmark = pytest.mark.engine


def seqs(n, **kw):
    return [Sequence([1], SamplingParams(**kw)) for _ in range(n)]


def test_greedy_is_argmax():
    logits = torch.randn(5, 50)
    assert sample(logits, seqs(5, temperature=0)) == logits.argmax(-1).tolist()
    assert sample(logits, seqs(5, temperature=1.0, top_k=1)) == logits.argmax(-1).tolist()


def test_seed_reproducible_and_independent_of_batch():
    torch.manual_seed(0)
    logits = torch.randn(1, 1000)
    a = [sample(logits, seqs(1, seed=42))[0] for _ in range(1)]
    s1, s2 = seqs(1, seed=42)[0], seqs(1, seed=42)[0]
    run1 = [sample(logits, [s1])[0] for _ in range(20)]
    other = seqs(3)  # unseeded neighbours change the batch, not the seeded row
    run2 = [sample(torch.cat([logits.expand(3, -1), logits]), other + [s2])[3] for _ in range(20)]
    assert run1 == run2
    assert run1[0] == a[0]
    s3 = seqs(1, seed=7)[0]
    assert [sample(logits, [s3])[0] for _ in range(20)] != run1


def test_top_k_and_top_p_masks():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    lp = filter_logits(logits, [SamplingParams(top_k=2)])
    assert torch.isfinite(lp[0, :2]).all() and torch.isinf(lp[0, 2:]).all()
    assert torch.allclose(lp[0, :2].exp(), torch.tensor([0.625, 0.375]))
    lp = filter_logits(logits, [SamplingParams(top_p=0.6)])  # 0.5 < 0.6, so 0.3 is still needed
    assert torch.isfinite(lp[0, :2]).all() and torch.isinf(lp[0, 2:]).all()
    lp = filter_logits(logits, [SamplingParams(top_p=0.4)])
    assert torch.isfinite(lp[0, 0]) and torch.isinf(lp[0, 1:]).all()
    lp = filter_logits(logits, [SamplingParams(top_p=0.9, top_k=3)])
    assert torch.isfinite(lp[0, :3]).all() and torch.isinf(lp[0, 3])


def test_sampled_frequencies_follow_the_filtered_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 4000
    logits = torch.log(probs).expand(n, -1).contiguous()
    toks = torch.tensor(sample(logits, seqs(n, top_p=0.9)))  # keeps {0, 1, 2}
    assert set(toks.tolist()) <= {0, 1, 2}
    freq = torch.bincount(toks, minlength=4).float() / n
    assert torch.allclose(freq[:3], probs[:3] / 0.95, atol=0.03)
    toks = torch.tensor(sample(logits, seqs(n, temperature=100.0)))  # nearly uniform
    freq = torch.bincount(toks, minlength=4).float() / n
    assert (freq - 0.25).abs().max() < 0.04
