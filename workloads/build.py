"""Prompts of dataset, corpus and trace workloads, and the sessions of conversation workloads.

Token mode keeps today's exact-length rule: a text is tokenized by the server under test (its
``/tokenize``, so the model's own tokenizer), then cut to the length asked for, or extended with the
tokens of the dataset's next texts when it is too short. Text mode sends the text as the user message of
``/v1/chat/completions``; with fixed or uniform lengths the text is cut (or extended) at the word
boundary where it holds that many tokens (the chat template then adds the server's own tokens around it). ``lengths = "dataset"`` keeps each text's own
length and takes the output length from the dataset (a JSONL ``output_field``, or the token count of the
recorded ShareGPT answer), else ``osl``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
import numpy as np

from k2bench.errors import UserError
from k2bench.net import normalize_base_url
from k2bench.workloads import datasets, trace
from k2bench.workloads.loader import Workload
from k2bench.workloads.prompts import (
    Prompt,
    Vocabulary,
    _post,
    _text_prompts,
    build_prompts,
    default_vocabulary,
    lengths,
)

CORPUS_WORDS_PER_TOKEN = 2  # words taken from a corpus per token wanted (then cut to the exact length)


@dataclass(frozen=True)
class Session:
    """One user's conversation: the user message of each turn and the output length asked for."""

    user: tuple[str, ...]
    output_lens: tuple[int, ...]
    input_lens: tuple[int, ...]  # tokens of each user message (the server's count where it tokenized)


class _Tokenizer:
    """The server's /tokenize over one session (setup before a level, not timed)."""

    def __init__(self, base_url: str | None, model: str | None, why: str) -> None:
        if not base_url:
            raise UserError(f"{why} needs the server's tokenizer (/tokenize); no server was given")
        self.root, self.model = normalize_base_url(base_url), model or ""

    async def __aenter__(self) -> _Tokenizer:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()

    async def encode(self, text: str) -> list[int]:
        return await _post(self.session, self.root + "/tokenize",
                           {"model": self.model, "prompt": text, "add_special_tokens": False}, "tokens")


def _samples(w: Workload) -> list[datasets.Sample]:
    if w.source == "jsonl":
        return datasets.read_jsonl(w.path or "", w.prompt_field, w.output_field)
    if w.source == "sharegpt":
        return datasets.first_turns(datasets.read_sharegpt(w.path or ""))
    raise AssertionError(w.source)


def _order(count: int, n: int, rng: np.random.Generator) -> list[int]:
    """n indices into count items: a seeded shuffle, repeated when n > count."""
    out: list[int] = []
    while len(out) < n:
        out.extend(rng.permutation(count).tolist())
    return out[:n]


async def _fit(tok: _Tokenizer, ids: list[int], want: int, more: list[str]) -> list[int]:
    """ids cut to ``want`` tokens, or extended with the tokens of the texts in ``more`` (cyclically)."""
    k = 0
    while len(ids) < want and more:
        ids = ids + await tok.encode(" " + more[k % len(more)])
        k += 1
        if k > 4 * len(more) and len(ids) < want:
            break
    if len(ids) < want:
        raise UserError(f"the dataset's texts hold fewer than {want} tokens in all; use shorter lengths")
    return ids[:want]


async def _cut_text(tok: _Tokenizer, text: str, want: int, more: list[str]) -> tuple[str, int]:
    """The dataset's own words, as many as fit in ``want`` tokens (extended with the next texts when too
    short), and their token count: exactly ``want`` unless a word boundary does not fall there."""
    words = text.split()
    k = 0
    while len(await tok.encode(" ".join(words))) < want and k < len(more):
        words += more[k].split()
        k += 1
    lo, hi = 1, len(words)  # the most words whose tokens fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(await tok.encode(" ".join(words[:mid]))) <= want:
            lo = mid
        else:
            hi = mid - 1
    cut = " ".join(words[:lo])
    return cut, len(await tok.encode(cut))


async def _dataset_prompts(w: Workload, n: int, tok: _Tokenizer, rng: np.random.Generator) -> list[Prompt]:
    ins, outs = lengths(w, n, rng)
    if w.source == "text":
        words = datasets.read_corpus(w.path or "")
        texts = []
        for want in ins.tolist():
            start = int(rng.integers(0, len(words)))
            take = want * CORPUS_WORDS_PER_TOKEN + 8
            texts.append(" ".join((words[start:] + words * (1 + take // len(words)))[:take]))
        samples = [datasets.Sample(text=t) for t in texts]
        order = list(range(n))
    else:
        samples = _samples(w)
        order = _order(len(samples), n, rng)
    out = []
    for i, idx in enumerate(order):
        s = samples[idx]
        ids = await tok.encode(s.text)
        if w.lengths == "dataset":
            want = len(ids)
            olen = s.output_len or (len(await tok.encode(s.answer)) if s.answer else 0) or w.osl
        else:
            want, olen = int(ins[i]), int(outs[i])
            later = [samples[(idx + k) % len(samples)].text for k in range(1, min(len(samples), 64))]
            ids = await _fit(tok, ids, want, later)
        if w.mode == "text":
            text = s.text
            if w.lengths != "dataset":
                text, want = await _cut_text(tok, s.text, want, [samples[(idx + k) % len(samples)].text
                                                                  for k in range(1, min(len(samples), 64))])
            out.append(Prompt(input_len=want, output_len=olen, text=text, chat=True))
        else:
            out.append(Prompt(input_len=want, output_len=olen, token_ids=np.asarray(ids, dtype=np.int32)))
    return out


def trace_prompts(w: Workload, vocab: Vocabulary | None = None) -> list[Prompt]:
    """Every request of the trace, in order, with its send time (seconds after the first)."""
    rows = trace.read_trace(w.path or "")
    allowed = (vocab or default_vocabulary(w)).allowed
    ids = trace.prompt_ids(rows, allowed, w.block_size, w.seed)
    at = trace.send_offsets_s(rows, w.time_scale)
    return [Prompt(input_len=r.input_length, output_len=r.output_length, token_ids=p, send_at_s=t)
            for r, p, t in zip(rows, ids, at, strict=True)]


def level_prompts(w: Workload, n: int, *, base_url: str | None = None, model: str | None = None,
                  vocab: Vocabulary | None = None, seed: int | None = None) -> list[Prompt]:
    """``n`` prompts of any single-turn workload: random ids (`prompts.build_prompts`), a dataset, or a trace."""
    if w.source == "random":
        return build_prompts(w, n, base_url=base_url, model=model, vocab=vocab, seed=seed)
    return dataset_prompts(w, n, base_url=base_url, model=model, vocab=vocab, seed=seed)


def dataset_prompts(w: Workload, n: int, *, base_url: str | None = None, model: str | None = None,
                    vocab: Vocabulary | None = None, seed: int | None = None) -> list[Prompt]:
    """``n`` prompts of a dataset or corpus workload (a trace gives its own requests, whatever ``n``)."""
    if w.source == "trace":
        return trace_prompts(w, vocab)
    rng = np.random.default_rng(w.seed if seed is None else seed)

    async def go() -> list[Prompt]:
        async with _Tokenizer(base_url, model, f"dataset workload {w.name!r}") as tok:
            return await _dataset_prompts(w, n, tok, rng)

    return asyncio.run(go())


def sessions(w: Workload, count: int, *, base_url: str | None = None, model: str | None = None,
             vocab: Vocabulary | None = None, seed: int | None = None) -> list[Session]:
    """``count`` conversations of ``w.turns`` turns: ShareGPT conversations with that many user turns, or
    random user messages of the workload's lengths (text, exact through the server's tokenizer)."""
    rng = np.random.default_rng(w.seed if seed is None else seed)
    if w.source == "random":
        from k2bench.workloads.prompts import token_prompts

        flat = token_prompts(w, count * w.turns, vocab, int(rng.integers(0, 2**31)))
        flat = asyncio.run(_text_prompts(base_url or "", model or "", flat)) if base_url else None
        if flat is None:
            raise UserError(f"conversation workload {w.name!r} needs the server's tokenizer; no server was given")
        return [Session(tuple(p.text or "" for p in flat[i * w.turns:(i + 1) * w.turns]),
                        tuple(p.output_len for p in flat[i * w.turns:(i + 1) * w.turns]),
                        tuple(p.input_len for p in flat[i * w.turns:(i + 1) * w.turns])) for i in range(count)]
    if w.source != "sharegpt":
        raise UserError(f"conversation workload {w.name!r}: turns > 1 needs source 'random' or 'sharegpt'")
    convs = [c for c in datasets.read_sharegpt(w.path or "") if len(c.user) >= w.turns]
    if not convs:
        raise UserError(f"{w.path}: no conversation has {w.turns} user turns")

    async def go() -> list[Session]:
        out = []
        async with _Tokenizer(base_url, model, f"conversation workload {w.name!r}") as tok:
            for idx in _order(len(convs), count, rng):
                c = convs[idx]
                ins, outs = lengths(w, w.turns, rng)
                user, ilens, olens = [], [], []
                for k in range(w.turns):
                    if w.lengths == "dataset":
                        user.append(c.user[k])
                        ilens.append(len(await tok.encode(c.user[k])))
                        answer = c.answers[k] if k < len(c.answers) else None
                        olens.append(len(await tok.encode(answer)) if answer else w.osl)
                    else:
                        text, got = await _cut_text(tok, c.user[k], int(ins[k]), [u for cc in convs
                                                                                  for u in cc.user][:64])
                        user.append(text)
                        ilens.append(got)
                        olens.append(int(outs[k]))
                out.append(Session(tuple(user), tuple(olens), tuple(ilens)))
        return out

    return asyncio.run(go())
