"""OpenAI request parsing and validation: every mistake becomes a RequestError (an HTTP 400)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from k2bench.engine.runtime.sequence import SamplingParams


class RequestError(ValueError):
    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.param = param
        self.code = code
        self.status = status


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(body: dict, name: str, default, lo: int | None = None, hi: int | None = None):
    v = body.get(name)
    if v is None:
        return default
    if not _is_int(v):
        raise RequestError(f"'{name}' must be an integer, got {type(v).__name__}", name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise RequestError(f"'{name}' = {v} is out of range [{lo}, {hi if hi is not None else 'inf'}]", name)
    return v


def _num(body: dict, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not _is_num(v) or not math.isfinite(v):  # NaN compares false with every bound
        raise RequestError(f"'{name}' must be a finite number, got {v!r}", name)
    if v < lo or v > hi or (lo_open and v == lo):
        raise RequestError(f"'{name}' = {v} is out of range {'(' if lo_open else '['}{lo}, {hi}]", name)
    return float(v)


def _bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise RequestError(f"'{name}' must be a boolean", name)
    return v


# Ranges that reach the engine's tensors: an int64 seed, an int32-sized top_k, bounded stop lists.
SEED_RANGE = (-(1 << 63), (1 << 63) - 1)
TOP_K_MAX = (1 << 31) - 1
MAX_STOPS = 16
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
# Sampling knobs this engine does not implement, with the value that means "off".
_NEUTRAL = {"min_p": 0.0, "repetition_penalty": 1.0, "typical_p": 1.0}


@dataclass
class ParsedRequest:
    params: SamplingParams
    max_tokens: int | None  # None: fill the context (filled in once the prompt length is known)
    stream: bool
    include_usage: bool
    stop: list[str] = field(default_factory=list)


def parse_common(body: dict, served_names: tuple[str, ...], default_max_tokens: int | None,
                 vocab_size: int | None = None) -> ParsedRequest:
    """Every sampling field checked against the range the engine can honour, so that nothing a client
    sends can make a batched step fail (one bad row would fail every request in that step)."""
    model = body.get("model")
    if model is not None and model not in served_names:
        raise RequestError(f"the model '{model}' does not exist; this server serves {', '.join(served_names)}",
                           "model", "model_not_found")
    if _int(body, "n", 1, 1) != 1:
        raise RequestError("only n = 1 is supported", "n")
    if _int(body, "best_of", 1, 1) != 1:
        raise RequestError("only best_of = 1 is supported", "best_of")
    for name in ("logprobs", "top_logprobs", "echo", "suffix", "logit_bias", "tools", "functions"):
        v = body.get(name)
        if v not in (None, False, 0, {}, []):
            raise RequestError(f"'{name}' is not supported by this server", name)
    for name, neutral in _NEUTRAL.items():
        if _num(body, name, neutral, -1e9, 1e9) != neutral:
            raise RequestError(f"'{name}' is not supported by this server (only {neutral:g})", name)
    max_tokens = _int(body, "max_completion_tokens", None, 1)
    max_tokens = _int(body, "max_tokens", max_tokens, 1) if max_tokens is None else max_tokens
    if max_tokens is None:
        max_tokens = default_max_tokens
    min_tokens = _int(body, "min_tokens", 0, 0)
    if max_tokens is not None and min_tokens > max_tokens:
        raise RequestError(f"min_tokens ({min_tokens}) exceeds max_tokens ({max_tokens})", "min_tokens")
    top_k = _int(body, "top_k", 0, -1, TOP_K_MAX)
    if top_k <= 0 or (vocab_size is not None and top_k >= vocab_size):
        top_k = 0  # off: every token is a candidate
    seed = _int(body, "seed", None, *SEED_RANGE)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise RequestError("'stop' must be a string or a list of strings", "stop")
    if len(stop) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stop):
        raise RequestError(f"'stop': at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters", "stop")
    stop = [s for s in stop if s]
    stop_ids = body.get("stop_token_ids")
    stop_ids = [] if stop_ids is None else stop_ids
    if not (isinstance(stop_ids, list) and all(_is_int(t) for t in stop_ids)):
        raise RequestError("'stop_token_ids' must be a list of integers", "stop_token_ids")
    hi = vocab_size if vocab_size is not None else 1 << 31
    if len(stop_ids) > MAX_STOP_TOKEN_IDS or any(not 0 <= t < hi for t in stop_ids):
        raise RequestError(f"'stop_token_ids': at most {MAX_STOP_TOKEN_IDS} ids, each in 0..{hi - 1}",
                           "stop_token_ids")
    stream = _bool(body, "stream", False)
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise RequestError("'stream_options' must be an object", "stream_options")
    include_usage = _bool(opts or {}, "include_usage", False)
    params = SamplingParams(
        temperature=_num(body, "temperature", 1.0, 0.0, 100.0),
        top_p=_num(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=top_k,
        seed=seed,
        max_tokens=max_tokens or 0,
        min_tokens=min_tokens,
        ignore_eos=_bool(body, "ignore_eos", False),
        stop_token_ids=tuple(stop_ids),
    )
    _num(body, "presence_penalty", 0.0, -2.0, 2.0)
    _num(body, "frequency_penalty", 0.0, -2.0, 2.0)
    return ParsedRequest(params, max_tokens, stream, include_usage, stop)


def parse_prompt(body: dict, vocab_size: int):
    """A completions prompt: text (str) or token ids (list[int]); a one-element batch is unwrapped."""
    if "prompt" not in body:
        raise RequestError("'prompt' is required", "prompt")
    p = body["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p and all(_is_int(t) for t in p):
        bad = next((t for t in p if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise RequestError(f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})", "prompt")
        return p
    if isinstance(p, list) and len(p) > 1:
        raise RequestError("batched prompts are not supported; send one prompt per request", "prompt")
    raise RequestError("'prompt' must be a non-empty string or a list of token ids", "prompt")


def parse_messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string 'role'", "messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text is understood
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise RequestError(f"messages[{i}].content: only text parts are supported", "messages")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string or a list of text parts", "messages")
        out.append({"role": m["role"], "content": content})
    return out


class StopStrings:
    """Finds stop strings in the streamed text, holding back just enough to never emit part of one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0

    def feed(self, delta: str) -> tuple[str, bool]:
        if not self.stops:
            return delta, False
        self.text += delta
        start = max(0, self.sent - self.hold)
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            end = min(hits)
            out = self.text[self.sent : end]
            self.sent = len(self.text)
            return out, True
        end = max(self.sent, len(self.text) - self.hold)
        out = self.text[self.sent : end]
        self.sent = end
        return out, False

    def flush(self) -> str:
        out = self.text[self.sent :]
        self.sent = len(self.text)
        return out
