"""Batched sampling: greedy, temperature, top-k, top-p, per-request seeds.

Sampling uses the exponential race (argmax of p / E with E ~ Exp(1)), which draws from p
exactly and needs no per-row multinomial; a seeded request draws its E from its own
generator, so its tokens do not depend on what else is in the batch.
"""

from __future__ import annotations

import torch

from k2bench.engine.runtime.sequence import SamplingParams, Sequence


def _noise(seqs: list[Sequence], shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    q = torch.empty(shape, device=device, dtype=torch.float32)
    seeded = [i for i, s in enumerate(seqs) if s.params.seed is not None]
    if len(seeded) < len(seqs):
        q.exponential_()
    for i in seeded:
        seq = seqs[i]
        if seq.generator is None:
            seq.generator = torch.Generator(device=device).manual_seed(int(seq.params.seed) % (1 << 64))
        q[i].exponential_(generator=seq.generator)
    return q


def filter_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature-scaled log-probabilities with everything outside top-k / top-p set to -inf."""
    device = logits.device
    temps = torch.tensor([p.temperature for p in params], device=device, dtype=torch.float32)
    logits = logits.float() / temps.unsqueeze(1)
    top_k = [p.top_k if p.top_k and p.top_k > 0 else 0 for p in params]
    top_p = [p.top_p for p in params]
    if not any(top_k) and all(p >= 1.0 for p in top_p):
        return logits.log_softmax(-1)
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device).unsqueeze(0)
    k = torch.tensor([k or vocab for k in top_k], device=device).unsqueeze(1)
    drop = ranks >= k
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = sorted_logits.softmax(-1)
    before = probs.cumsum(-1) - probs  # mass of strictly better tokens
    p = torch.tensor(top_p, device=device, dtype=torch.float32).unsqueeze(1)
    drop = drop | (before >= p)
    drop[:, 0] = False  # the best token always survives
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    out = torch.full_like(logits, float("-inf"))
    out.scatter_(1, order, sorted_logits)
    return out.log_softmax(-1)


def sample_tensor(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """One token per row of `logits` [n, vocab] for the matching sequence, as an int64 tensor on the logits'
    device: nothing here waits for the device, so the step after can be launched before these are read."""
    greedy = [s.params.greedy for s in seqs]
    if all(greedy):
        return logits.argmax(-1)
    rows = [i for i, g in enumerate(greedy) if not g]
    sub = [seqs[i] for i in rows]
    logp = filter_logits(logits[rows], [s.params for s in sub])
    q = _noise(sub, tuple(logp.shape), logits.device)
    # argmax p/q == argmax (log p - log q); -inf rows stay out.
    picked = (logp - q.log()).argmax(-1)
    if len(rows) == len(seqs):
        return picked
    out = logits.argmax(-1)  # the greedy rows; only a mixed batch needs it
    out[torch.tensor(rows, device=logits.device)] = picked
    return out


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """One token per row of `logits` [n, vocab] for the matching sequence."""
    if not seqs:
        return []
    return sample_tensor(logits, seqs).tolist()
