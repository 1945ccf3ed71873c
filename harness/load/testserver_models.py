"""What the test server (k2bench.harness.load.testserver) models besides its timing, kept apart from the
HTTP server so each can be read alone: its stream records, vLLM's phase histograms and speculative
counters, a prefix cache and a word-level tokenizer.

With ``--queue-ms Q`` each request first waits Q ms as if queued, then its TTFT clock starts
(the first token leaves Q + ttft_ms + prefill after arrival). With ``--metrics`` it serves /metrics
with vLLM's per-request phase histograms (queue, prefill, decode, inference), observed from its own
stamps just before each stream's usage and [DONE] go out, in buckets 2% wide, so a histogram read of
them can be checked against the streams' records (``/stats?streams=1``). ``--spec-tokens K
--spec-accept-len L`` adds vLLM's spec_decode counters as a speculating server would count a stream of
n tokens: its n - 1 tokens after the first in ceil((n - 1) / L) steps (drafts) of K draft tokens each,
every step's last token the target model's own (accepted = n - 1 - drafts).

Its tokenizer is word-level: token id ``i`` is the word ``t<i>``; other words hash to an id. A chat
request's prompt is the tokens of its messages' contents, one after the other.

``--prefix-cache-blocks N`` turns on a model of automatic prefix caching: prompts are cut into blocks of
``--cache-block-size`` tokens, each keyed by a hash chained over its tokens and every block before it; a
request's cached tokens are its leading blocks already held (at most the prompt less one token, as vLLM
reports them), counted from arrival; the cache keeps the N most recently used blocks. It reports
``usage.prompt_tokens_details.cached_tokens`` and, on ``/metrics``, the counters
``k2bench_prefix_cache_queries_total`` and ``k2bench_prefix_cache_hits_total`` (prompt tokens looked up and
found), and prefill time is charged for uncached tokens only.
"""

from __future__ import annotations

import math
import zlib
from collections import OrderedDict
from typing import NamedTuple

VOCAB_SIZE = 32000


class StreamRecord(NamedTuple):
    """What one completed stream did, timed at the server (time.monotonic seconds)."""

    number: int  # the request's number, from 1 in arrival order
    arrived: float
    first_sent: float
    last_sent: float
    messages: int
    tokens: int
    prompt_tokens: int
    scheduled: float = 0.0  # when its queue waits ended (admitted + queue_ms)
    admitted: float = 0.0  # when it left the --max-running queue (== arrived when it did not wait)
    running: int = 0  # streams running when it was admitted, itself included
    first_due: float = 0.0  # the load model's deadline of the first message (sent at or after it)
    last_due: float = 0.0  # and of the last: the schedule without the server's own lateness


# 0.5 ms to about 2 minutes, each bucket 2% wider than the one before: a quantile read from them is
# off by at most 2% of its value
_BUCKETS = tuple(round(0.0005 * 1.02 ** i, 9) for i in range(630))
PHASES = {"queue": "request_queue_time_seconds", "prefill": "request_prefill_time_seconds",
          "decode": "request_decode_time_seconds", "inference": "request_inference_time_seconds"}


class PhaseMetrics:
    """vLLM's phase histograms in a registry of this server's own."""

    def __init__(self, spec_tokens: int = 0, spec_accept_len: float = 0.0) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.hists = {phase: Histogram("vllm:" + name, f"{phase} time of a request", buckets=_BUCKETS,
                                       registry=self.registry) for phase, name in PHASES.items()}
        self.spec_tokens, self.spec_accept_len = spec_tokens, spec_accept_len
        self.spec = {name: Counter("vllm:spec_decode_" + name, f"speculative decoding: {name}", registry=self.registry)
                     for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")} if spec_tokens else {}

    def observe(self, rec: StreamRecord) -> None:
        self.hists["queue"].observe(rec.scheduled - rec.arrived)
        self.hists["prefill"].observe(rec.first_sent - rec.scheduled)
        self.hists["decode"].observe(rec.last_sent - rec.first_sent)
        self.hists["inference"].observe(rec.last_sent - rec.scheduled)
        if self.spec and rec.tokens > 1:
            steps = math.ceil((rec.tokens - 1) / self.spec_accept_len)
            self.spec["num_drafts"].inc(steps)
            self.spec["num_draft_tokens"].inc(steps * self.spec_tokens)
            self.spec["num_accepted_tokens"].inc(rec.tokens - 1 - steps)

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def tokenize(text: str) -> list[int]:
    ids = []
    for word in text.split():
        if word[:1] == "t" and word[1:].isdigit():
            ids.append(int(word[1:]) % VOCAB_SIZE)
        else:
            ids.append(zlib.crc32(word.encode()) % VOCAB_SIZE)
    return ids


def detokenize(ids: list[int]) -> str:
    return " ".join(f"t{int(i)}" for i in ids)


def prompt_ids(prompt: object) -> list[int]:
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
        return prompt_ids(prompt[0])
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    raise ValueError("prompt must be a string, a list of token ids, or a one-element batch of either")


class PrefixCache:
    """Full blocks keyed by a hash chained over their tokens and their prefix, least recently used out."""

    def __init__(self, blocks: int, block_size: int) -> None:
        self.capacity, self.size = blocks, block_size
        self.held: OrderedDict[int, None] = OrderedDict()
        self.queries = self.hits = 0

    def lookup_and_insert(self, ids: list[int]) -> int:
        """Tokens of ``ids`` found cached (whole leading blocks, at most len - 1); then every full block is held."""
        keys, h = [], 0
        for start in range(0, len(ids) - self.size + 1, self.size):
            h = hash((h, tuple(ids[start:start + self.size])))
            keys.append(h)
        hit = 0
        for key in keys:
            if key not in self.held:
                break
            hit += 1
        cached = min(hit * self.size, max(len(ids) - 1, 0))
        for key in keys:
            self.held[key] = None
            self.held.move_to_end(key)
        while len(self.held) > self.capacity:
            self.held.popitem(last=False)
        self.queries += len(ids)
        self.hits += cached
        return cached

    def exposition(self) -> bytes:
        """Its counters in Prometheus' text format, named as the bundled engine names them."""
        lines = []
        for name, value, what in (("queries", self.queries, "prompt tokens looked up in the prefix cache"),
                                  ("hits", self.hits, "prompt tokens found in the prefix cache")):
            lines += [f"# HELP k2bench_prefix_cache_{name}_total {what}",
                      f"# TYPE k2bench_prefix_cache_{name}_total counter",
                      f"k2bench_prefix_cache_{name}_total {value}"]
        return ("\n".join(lines) + "\n").encode()


def chat_ids(messages: object) -> list[int]:
    if not (isinstance(messages, list) and messages
            and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages)):
        raise ValueError("messages must be a non-empty list of {role, content} objects")
    return [t for m in messages for t in tokenize(m["content"])]
