"""Continuous batching with chunked prefill, preemption by recomputation, and a prefill delay factor.

Each step has a token budget (max_num_batched_tokens). Running sequences go first, oldest
first: a decoding one takes one token, one still prefilling takes the next chunk of its prompt.
What is left of the budget goes to new sequences from the waiting queue, admitted only when
their whole prompt fits in free KV blocks, the batch has room (max_num_seqs), and the delay
factor allows it. When a running sequence needs a new block and none is free, the most recently
admitted running sequence is preempted: its blocks are freed and it goes back to the front of
the waiting queue, to be recomputed (prompt and generated tokens) when it is admitted again.
With prefix caching, admission starts a sequence after the longest cached chain of full blocks of
its tokens (block_manager.py), and blocks a step completed are made findable after that step.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from k2bench.engine.runtime.block_manager import BlockManager, blocks_for
from k2bench.engine.runtime.runtime_config import RuntimeConfig
from k2bench.engine.runtime.sequence import SeqStatus, Sequence


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new: int  # tokens fed this step: token_ids[start : start + num_new]
    start: int  # num_computed before this step
    ahead: bool = False  # a decode scheduled before the previous step's token was read (`schedule_ahead`)

    @property
    def samples(self) -> bool:
        """The step reaches the end of the known tokens, so it yields the next one."""
        return self.ahead or self.start + self.num_new == self.seq.num_tokens

    @property
    def is_prefill(self) -> bool:
        return self.start + 1 < self.seq.num_tokens


@dataclass
class SchedulerOutput:
    seqs: list[ScheduledSeq]
    num_tokens: int
    num_prefill_tokens: int
    preempted: list[Sequence]
    admitted: list[Sequence] = field(default_factory=list)  # admitted for the first time (prompt counted once)

    @property
    def empty(self) -> bool:
        return not self.seqs


class Scheduler:
    def __init__(self, config: RuntimeConfig, block_manager: BlockManager, eos_token_ids: tuple[int, ...] = ()):
        self.config = config
        self.blocks = block_manager
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.last_prefill_latency = 0.0  # seconds; set by the engine after each step that prefilled
        self.num_preemptions = 0
        self._watermark = int(block_manager.num_blocks * config.kv_watermark)

    # ---- queue management -------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.params.check()
        total = seq.num_prompt_tokens + seq.params.max_tokens
        if seq.num_prompt_tokens < 1:
            raise ValueError("empty prompt")
        if total > self.config.max_model_len:
            raise ValueError(
                f"prompt ({seq.num_prompt_tokens} tokens) + max_tokens ({seq.params.max_tokens}) "
                f"exceeds max_model_len {self.config.max_model_len}"
            )
        if blocks_for(total, self.blocks.block_size) > self.blocks.num_blocks:
            raise ValueError(f"a request of {total} tokens cannot fit in the KV cache "
                             f"({self.blocks.num_blocks} blocks of {self.blocks.block_size})")
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        if seq.is_finished:
            return
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self._finish(seq, "abort")

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ---------------------------------------------------------------------------
    def schedule(self, now: float | None = None) -> SchedulerOutput:
        now = time.monotonic() if now is None else now
        budget = self.config.max_num_batched_tokens
        out: list[ScheduledSeq] = []
        preempted: list[Sequence] = []
        admitted: list[Sequence] = []
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = min(seq.num_uncomputed, budget)
            while not self.blocks.can_fit(seq, seq.num_computed + n):
                victim = running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                self.blocks.grow(seq, seq.num_computed + n)
                out.append(ScheduledSeq(seq, n, seq.num_computed))
                budget -= n
                i += 1
                continue
            break  # the sequence itself was preempted: nothing behind it is left to schedule

        if not preempted and self.waiting and self._admission_allowed(now):
            while self.waiting and budget > 0 and len(running) < self.config.max_num_seqs:
                seq = self.waiting[0]
                reserve = 0 if (seq.num_preemptions or not running) else self._watermark
                # Blocks for the whole known sequence now, so that prefill chunks never preempt; a cached
                # prefix is reused and only the rest is computed.
                cached = self.blocks.allocate(seq, reserve)
                if cached is None:
                    break
                self.waiting.popleft()
                seq.status = SeqStatus.RUNNING
                if seq.num_cached_tokens is None:
                    seq.num_cached_tokens = cached
                    admitted.append(seq)
                if seq.first_scheduled_time is None:
                    seq.first_scheduled_time = now
                running.append(seq)
                n = min(seq.num_uncomputed, budget)
                out.append(ScheduledSeq(seq, n, seq.num_computed))
                budget -= n

        num_tokens = self.config.max_num_batched_tokens - budget
        prefill = sum(s.num_new for s in out if s.is_prefill)
        return SchedulerOutput(out, num_tokens, prefill, preempted, admitted)

    def schedule_ahead(self, prev: SchedulerOutput) -> SchedulerOutput | None:
        """The step after `prev`, scheduled while `prev` still runs and its tokens are unknown; or None when
        that step could be anything but what `schedule` would give once they are known.

        It is the next decode of every running sequence, in the running order, when each of them sampled
        in `prev` and no waiting request could be admitted. A sequence that `prev`'s token will end by
        length is left out; one that its token ends otherwise (EOS, a stop token, an abort) is computed
        and its row dropped when the step is read (`postprocess` skips finished sequences), as its KV slot
        lies in a block no other sequence can find. Blocks for the new token are taken here, so a step
        that would need a preemption is not scheduled ahead."""
        if self.waiting and len(self.running) < self.config.max_num_seqs:
            return None  # admission may happen: `schedule` decides once `prev` is read
        after: dict[int, int] = {}
        for s in prev.seqs:
            if not s.samples:
                return None  # a chunk still prefilling
            after[id(s.seq)] = s.start + s.num_new
        max_len = self.config.max_model_len
        bs = self.blocks.block_size
        nxt: list[ScheduledSeq] = []
        short: list[ScheduledSeq] = []  # those whose new token needs a block they do not hold yet
        for seq in self.running:
            start = after.get(id(seq))
            if start is None:
                return None  # a running sequence that `prev`'s budget left out
            if len(seq.token_ids) - seq.num_prompt_tokens + 1 >= seq.params.max_tokens or start + 1 >= max_len:
                continue  # `prev`'s token is its last
            s = ScheduledSeq(seq, 1, start, ahead=True)
            nxt.append(s)
            if start + 1 > len(seq.block_table) * bs:
                short.append(s)
        if not nxt or len(nxt) > self.config.max_num_batched_tokens:
            return None
        if sum(self.blocks.extra_blocks(s.seq, s.start + 1) for s in short) > self.blocks.num_free:
            return None  # `schedule` preempts
        for s in short:
            self.blocks.grow(s.seq, s.start + 1)
        return SchedulerOutput(nxt, len(nxt), 0, [])

    def _admission_allowed(self, now: float) -> bool:
        factor = self.config.scheduler_delay_factor
        if factor <= 0 or not self.running:
            return True
        oldest = min(s.arrival_time for s in self.waiting)
        return now - oldest > factor * self.last_prefill_latency

    def _preempt(self, seq: Sequence) -> None:
        self.blocks.free(seq)
        seq.num_computed = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    # ---- after the model ran ----------------------------------------------------------------
    def postprocess(self, out: SchedulerOutput, sampled: list[int]) -> list[Sequence]:
        """Advance each scheduled sequence; append sampled tokens (one per sampling sequence, in order).

        Returns the sequences that got a new token (finished ones included).
        """
        updated: list[Sequence] = []
        k = 0
        max_len = self.config.max_model_len
        commit = self.blocks.commit if self.blocks.enable_caching else None  # hoisted: 128 rows a step
        for s in out.seqs:
            seq = s.seq
            samples = s.samples
            if seq.status is SeqStatus.FINISHED:  # ended (stop token, abort) while this step ran ahead of reading it
                k += samples
                continue
            seq.num_computed = s.start + s.num_new
            if commit is not None:
                commit(seq)
            if not samples:
                continue
            tok = sampled[k]
            k += 1
            seq.append(tok)
            updated.append(seq)
            p = seq.params
            n_out = seq.num_output_tokens
            if n_out >= p.min_tokens and not p.ignore_eos and tok in self.eos_token_ids:
                self._retire(seq, "stop")
            elif n_out >= p.min_tokens and tok in p.stop_token_ids:
                self._retire(seq, "stop")
            elif n_out >= p.max_tokens or seq.num_tokens >= max_len:
                self._retire(seq, "length")
        return updated

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence from outside (a stop string matched by the server)."""
        if seq.status is SeqStatus.RUNNING:
            self._retire(seq, reason)
        elif not seq.is_finished:
            self.waiting.remove(seq)
            self._finish(seq, reason)

    def _retire(self, seq: Sequence, reason: str) -> None:
        self.running.remove(seq)
        self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.blocks.free(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
