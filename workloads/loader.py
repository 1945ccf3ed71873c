"""Workload definitions (TOML in defs/) and the prompts they produce.

By default a prompt is a list of token ids drawn from a seeded generator, so its length is
exact whatever the tokenizer does with text. Ids come from a range that avoids special tokens:
the model's own vocabulary minus its added tokens when the model folder is at hand, else
the workload's ``token_id_range`` (default [1000, 30000), ordinary tokens in every common
vocabulary of 32k ids or more).

Text mode turns each id list into text through the server (``/detokenize``), re-tokenises it
(``/tokenize``), trims to the wanted length and checks the count the server reports, so text
prompts are exact too.

Range ratio works as in InferenceX's client: each request's input and output lengths are drawn
uniformly from [floor(L x ratio), L]; 1.0 means exact lengths.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

import aiohttp
import numpy as np

from k2bench.errors import ServerError, UserError
from k2bench.harness.loadgen import Prompt, normalize_base_url

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_TOKEN_RANGE = (1000, 30000)
MODES = ("tokens", "text")
_KEYS = {"name", "description", "isl", "osl", "range_ratio", "mode", "seed", "token_id_range"}


@dataclass(frozen=True)
class Workload:
    name: str
    isl: int
    osl: int
    range_ratio: float = 1.0
    mode: str = "tokens"
    seed: int = 0
    token_id_range: tuple[int, int] = DEFAULT_TOKEN_RANGE
    description: str = ""

    def __post_init__(self) -> None:
        for key in ("isl", "osl"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"workload {self.name!r}: {key} must be a whole number >= 1, got {v!r}")
        if not (0 < self.range_ratio <= 1):
            raise UserError(f"workload {self.name!r}: range_ratio must be in (0, 1], got {self.range_ratio!r}")
        if self.mode not in MODES:
            raise UserError(f"workload {self.name!r}: mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        lo, hi = self.token_id_range
        if not (0 <= lo < hi):
            raise UserError(f"workload {self.name!r}: token_id_range must be [lo, hi) with 0 <= lo < hi")

    def with_lengths(self, isl: int | None, osl: int | None) -> Workload:
        """This workload with ISL/OSL overridden (the name says so when they differ)."""
        if (isl is None or isl == self.isl) and (osl is None or osl == self.osl):
            return self
        new_isl, new_osl = isl or self.isl, osl or self.osl
        return replace(self, name=f"{self.name}@isl{new_isl}-osl{new_osl}", isl=new_isl, osl=new_osl)


def defs_dir() -> Path:
    return Path(str(resources.files("k2bench.workloads") / "defs"))


def available() -> list[str]:
    return sorted(p.stem for p in defs_dir().glob("*.toml"))


def parse(doc: dict, where: str) -> Workload:
    unknown = set(doc) - _KEYS
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_KEYS))}")
    missing = {"name", "isl", "osl"} - set(doc)
    if missing:
        raise UserError(f"{where}: missing key(s) {', '.join(sorted(missing))}")
    rng = doc.get("token_id_range", DEFAULT_TOKEN_RANGE)
    if not (isinstance(rng, (list, tuple)) and len(rng) == 2 and all(isinstance(x, int) for x in rng)):
        raise UserError(f"{where}: token_id_range must be two whole numbers [lo, hi)")
    try:
        ratio = float(doc.get("range_ratio", 1.0))
    except (TypeError, ValueError):
        raise UserError(f"{where}: range_ratio must be a number") from None
    return Workload(name=str(doc["name"]), isl=doc["isl"], osl=doc["osl"], range_ratio=ratio,
                    mode=str(doc.get("mode", "tokens")), seed=int(doc.get("seed", 0)),
                    token_id_range=(rng[0], rng[1]), description=str(doc.get("description", "")))


def load(name_or_path: str) -> Workload:
    """A workload by name (defs/NAME.toml) or by path to a TOML file."""
    path = Path(name_or_path)
    if not (path.suffix == ".toml" and path.exists()):
        path = defs_dir() / f"{name_or_path}.toml"
        if not path.exists():
            raise UserError(f"unknown workload {name_or_path!r}; known: {', '.join(available())} "
                            f"(or give a path to a .toml file)")
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read workload {path}: {exc}") from None
    return parse(doc, str(path))


def resolve(name: str | None, isl: int | None, osl: int | None) -> Workload:
    """The workload a sweep runs: --workload (with --isl/--osl overriding), else the definition
    whose lengths match --isl/--osl exactly, else an ad-hoc exact-length one; 8k1k by default."""
    if name:
        return load(name).with_lengths(isl, osl)
    if isl is None and osl is None:
        return load("8k1k")
    base = load("8k1k")
    isl, osl = isl or base.isl, osl or base.osl
    for known in available():
        w = load(known)
        if (w.isl, w.osl, w.range_ratio, w.mode) == (isl, osl, 1.0, "tokens"):
            return w
    return Workload(name=f"isl{isl}-osl{osl}", isl=isl, osl=osl, description="exact lengths (from --isl/--osl)")


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
    """``n`` token-id prompts of the workload's lengths (int32 arrays); same seed, same prompts."""
    vocab = vocab or default_vocabulary(w)
    rng = np.random.default_rng(w.seed if seed is None else seed)
    ins, outs = lengths(w, n, rng)
    prompts = []
    for i_len, o_len in zip(ins.tolist(), outs.tolist(), strict=True):
        ids = vocab.allowed[rng.integers(0, vocab.allowed.size, size=i_len)].astype(np.int32)
        prompts.append(Prompt(input_len=i_len, output_len=o_len, token_ids=ids))
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
    """The prompts of one level: token ids, or verified text in text mode (needs the server)."""
    prompts = token_prompts(w, n, vocab, seed)
    if w.mode == "text":
        if not base_url:
            raise UserError("text-mode workloads need a server to tokenize against")
        from k2bench.harness.loadgen import run

        prompts = run(_text_prompts(base_url, model or "", prompts))
    return prompts
