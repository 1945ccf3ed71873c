"""The prompts a workload produces, and the `Prompt` the load generator sends.

By default a prompt is a list of token ids drawn from a seeded generator, so its length is
exact whatever the tokenizer does with text. Ids come from a range that avoids special tokens:
the model's own vocabulary minus its added tokens when the model folder is at hand, else
the workload's ``token_id_range`` (default [1000, 30000), ordinary tokens in every common
vocabulary of 32k ids or more).

Text mode turns each id list into text through the server (``/detokenize``), re-tokenises it
(``/tokenize``), trims to the wanted length and checks the count the server reports, so text
prompts are exact too.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

from k2bench.errors import ServerError, UserError
from k2bench.net import normalize_base_url
from k2bench.workloads.loader import Workload


@dataclass(frozen=True)
class Prompt:
    """One request of a workload: the prompt (token ids or text) and the lengths asked for."""

    input_len: int
    output_len: int
    token_ids: Sequence[int] | None = None  # a list, or a numpy array (compact for long prompts)
    text: str | None = None
    chat: bool = False  # send ``text`` as the user message of /v1/chat/completions
    send_at_s: float | None = None  # trace replay: when to send, seconds after the level's start

    @property
    def prompt(self) -> Sequence[int] | str:
        return self.token_ids if self.token_ids is not None else (self.text or "")


# ---------------------------------------------------------------------------------- token ids
@dataclass
class Vocabulary:
    """Which token ids a random prompt may use."""

    allowed: np.ndarray  # sorted ids
    source: str = "default range"
    special: list[int] = field(default_factory=list)


def vocabulary_from_model_dir(model_dir: str | Path) -> Vocabulary | None:
    """Read vocab_size and the added (special) tokens from a local HF-layout model folder."""
    d = Path(model_dir)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        return None
    try:
        cfg = json.loads(cfg_path.read_text())
        vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
        special: set[int] = set()
        tok_path = d / "tokenizer.json"
        if tok_path.is_file():
            tok = json.loads(tok_path.read_text())
            special = {int(t["id"]) for t in tok.get("added_tokens", [])}
            vocab = vocab or len((tok.get("model") or {}).get("vocab") or {})
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            v = cfg.get(key)
            for i in v if isinstance(v, list) else [v]:
                if isinstance(i, int):
                    special.add(i)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"cannot read the vocabulary of {d}: {exc}") from None
    if not vocab:
        return None
    allowed = np.setdiff1d(np.arange(int(vocab)), np.fromiter(special, dtype=np.int64, count=len(special)))
    if allowed.size == 0:
        raise UserError(f"{d}: every token id is special; cannot build random prompts")
    return Vocabulary(allowed=allowed, source=str(d), special=sorted(special))


def default_vocabulary(w: Workload) -> Vocabulary:
    lo, hi = w.token_id_range
    return Vocabulary(allowed=np.arange(lo, hi), source=f"token_id_range [{lo}, {hi})")


def lengths(w: Workload, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if w.range_ratio >= 1.0:
        return np.full(n, w.isl), np.full(n, w.osl)
    ins = rng.integers(max(1, math.floor(w.isl * w.range_ratio)), w.isl + 1, size=n)
    outs = rng.integers(max(1, math.floor(w.osl * w.range_ratio)), w.osl + 1, size=n)
    return ins, outs


def token_prompts(w: Workload, n: int, vocab: Vocabulary | None = None, seed: int | None = None) -> list[Prompt]:
    """``n`` token-id prompts of the workload's lengths (int32 arrays); same seed, same prompts.

    With ``prefix_len``, request i belongs to group i mod ``prefix_groups`` and starts with that group's
    prefix (drawn from the workload's seed, so every level shares it); the rest of each prompt is its own."""
    vocab = vocab or default_vocabulary(w)
    rng = np.random.default_rng(w.seed if seed is None else seed)
    ins, outs = lengths(w, n, rng)
    prefixes = [vocab.allowed[np.random.default_rng([w.seed, 3, g]).integers(0, vocab.allowed.size,
                                                                            size=w.prefix_len)]
                for g in range(w.prefix_groups)] if w.prefix_len else []
    prompts = []
    for i, (i_len, o_len) in enumerate(zip(ins.tolist(), outs.tolist(), strict=True)):
        own = i_len - (w.prefix_len if prefixes else 0)
        ids = vocab.allowed[rng.integers(0, vocab.allowed.size, size=own)]
        if prefixes:
            ids = np.concatenate([prefixes[i % len(prefixes)], ids])
        prompts.append(Prompt(input_len=i_len, output_len=o_len, token_ids=ids.astype(np.int32)))
    return prompts


# ---------------------------------------------------------------------------------- text mode
async def _post(session: aiohttp.ClientSession, url: str, body: dict, key: str):
    """POST body to url and return field ``key`` of the JSON answer; any unusable answer is a ServerError."""
    try:
        async with session.post(url, json=body) as resp:
            if resp.status == 404:
                raise UserError(f"text-mode workloads need the server's /tokenize and /detokenize; {url} answered "
                                f"404 (use the default token-id mode)")
            text = await resp.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise ServerError(f"{url}: no usable answer ({exc.__class__.__name__}: {exc})") from None
    if resp.status != 200:
        raise ServerError(f"{url} answered HTTP {resp.status}: {text[:300]}")
    try:
        return json.loads(text)[key]
    except (ValueError, KeyError, TypeError, IndexError):
        raise ServerError(f"{url} did not answer a JSON object with {key!r}: {text[:200]}") from None


async def _text_prompts(base_url: str, model: str, token_sets: list[Prompt]) -> list[Prompt]:
    root = normalize_base_url(base_url)
    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for p in token_sets:
            ids = np.asarray(p.token_ids if p.token_ids is not None else [], dtype=np.int64).tolist()
            text, count = "", -1
            for _ in range(4):  # decode, re-encode, trim: converges in one or two rounds
                text = await _post(session, root + "/detokenize", {"model": model, "tokens": ids}, "prompt")
                got = await _post(session, root + "/tokenize", {"model": model, "prompt": text,
                                                                "add_special_tokens": False}, "tokens")
                count = len(got)
                if count == p.input_len:
                    break
                ids = (got + ids)[: p.input_len] if count < p.input_len else got[: p.input_len]
            if count != p.input_len:
                raise ServerError(f"text prompt did not round-trip to {p.input_len} tokens through {root}/tokenize "
                                  f"(got {count}); use the default token-id mode")
            out.append(Prompt(input_len=p.input_len, output_len=p.output_len, text=text))
    return out


def build_prompts(w: Workload, n: int, *, base_url: str | None = None, model: str | None = None,
                  vocab: Vocabulary | None = None, seed: int | None = None) -> list[Prompt]:
    """The prompts of one level of random ids: token ids, or verified text in text mode (needs the server).
    `k2bench.workloads.build.level_prompts` builds those of every source."""
    if w.source != "random":
        raise ValueError(f"workload {w.name!r} has source {w.source!r}: build its prompts with build.level_prompts")
    prompts = token_prompts(w, n, vocab, seed)
    if w.mode == "text":
        if not base_url:
            raise UserError("text-mode workloads need a server to tokenize against")
        # setup before the level, not timed: the standard event loop is good enough here
        prompts = asyncio.run(_text_prompts(base_url, model or "", prompts))
    return prompts
