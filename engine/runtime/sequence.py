"""One request as the runtime sees it: its tokens, how many are in the KV cache, and its blocks."""

from __future__ import annotations

import enum
import itertools
import math
import time
from dataclasses import dataclass, field


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SamplingParams:
    """Per-request sampling and stopping rules (validated by the server before they get here)."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def check(self) -> None:
        """Raise ValueError for values the sampler's tensors cannot hold (the server's parser refuses
        them first; this keeps the engine safe for any other caller)."""
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature {self.temperature!r} must be a finite number >= 0")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p {self.top_p!r} must be in (0, 1]")
        if not -1 <= self.top_k < 1 << 31:
            raise ValueError(f"top_k {self.top_k!r} must be -1, 0 (off) or a positive int32")
        if self.seed is not None and not -(1 << 63) <= self.seed < 1 << 63:
            raise ValueError(f"seed {self.seed!r} must fit in 64 signed bits")
        if self.min_tokens < 0 or self.max_tokens < 0:
            raise ValueError("min_tokens and max_tokens must be >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5 or self.top_k == 1  # tinier temperatures overflow the logits


_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    """Tokens of one request; `num_computed` of them are already in the KV cache.

    A step feeds tokens [num_computed, num_computed + n) of `token_ids` and, when that reaches the
    end of `token_ids`, samples one more token. Prefill, chunked prefill, decode and recomputation
    after preemption are all this one rule.
    """

    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""
    arrival_time: float = field(default_factory=time.monotonic)
    seq_id: int = field(default_factory=lambda: next(_ids))
    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    block_keys: list[bytes] = field(default_factory=list)  # prefix-cache keys of full token blocks (block_manager)
    num_committed_blocks: int = 0  # leading blocks of block_table already findable in the prefix cache
    num_cached_tokens: int | None = None  # prompt tokens found in the prefix cache at first admission
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    generator: object | None = None  # torch.Generator for seeded sampling (made by the sampler)

    def __post_init__(self) -> None:
        self.token_ids: list[int] = list(self.prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def append(self, token_id: int) -> None:
        self.token_ids.append(token_id)
