"""The step loop (LLMEngine) and the thread that runs it next to the server's asyncio loop.

The engine thread owns the scheduler, the runner and every Sequence; the server only talks to
it through `AsyncEngine` (a locked inbox in, one `call_soon_threadsafe` per step out), so no
lock is held while the model runs and torch releases the GIL for the HTTP side.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from k2bench.engine.runtime.runner import ModelRunner, SampledTokens
from k2bench.engine.runtime.sampling import sample
from k2bench.engine.runtime.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from k2bench.engine.runtime.sequence import Sequence

log = logging.getLogger(__name__)


class RanksOutOfStep(RuntimeError):
    """Rank 0 failed where tensor-parallel workers may already be inside a collective: not recoverable."""


@dataclass
class _Launched:
    """A step on its way: launched on the device, its tokens not yet read."""
    sched: SchedulerOutput
    logits: torch.Tensor | None
    tokens: SampledTokens | None  # None: sampling the batch failed, to be retried row by row

    def ahead_ids(self, nxt: SchedulerOutput) -> torch.Tensor:
        """The input ids of `nxt` (scheduled ahead of this step) from this step's samples on the device."""
        dev = self.tokens.device
        sampled = [s.seq for s in self.sched.seqs if s.samples]
        if len(sampled) == len(nxt.seqs) and all(a is b.seq for a, b in zip(sampled, nxt.seqs, strict=True)):
            return dev  # the same sequences in the same order: the samples are the ids
        row = {id(seq): i for i, seq in enumerate(sampled)}
        idx = [row[id(s.seq)] for s in nxt.seqs]
        return dev.index_select(0, torch.tensor(idx, dtype=torch.int64).to(dev.device, non_blocking=True))


@dataclass
class EngineStats:
    prompt_tokens: int = 0  # prompt tokens of requests that were admitted at least once (prefix-cache queries)
    prefix_cache_hits: int = 0  # of those, tokens found in the prefix cache at first admission
    computed_tokens: int = 0  # tokens the model ran (prefill, recompute and decode)
    generation_tokens: int = 0
    steps: int = 0
    steps_ahead: int = 0  # of those, launched before the step before them was read (`LLMEngine.overlaps`)
    requests_finished: int = 0
    requests_aborted: int = 0
    step_seconds: float = 0.0


class LLMEngine:
    def __init__(self, runner: ModelRunner, scheduler: Scheduler, comm=None):
        self.runner = runner
        self.scheduler = scheduler
        self.comm = comm  # tensor-parallel broadcaster (rank 0), or None
        self.stats = EngineStats()
        self.idle_step = False  # the last step found nothing it could schedule
        self.failed: list[tuple[Sequence, str]] = []  # the last step's aborted requests and why
        self._ahead: _Launched | None = None  # the step launched before the last one was read
        self.last_sched: SchedulerOutput | None = None  # the step the last `step` call returned (benches read it)

    @property
    def config(self):
        return self.scheduler.config

    def check(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Raise ValueError when a request can never run (the server turns it into a 400)."""
        max_len = self.config.max_model_len
        if num_prompt_tokens < 1:
            raise ValueError("the prompt is empty")
        if num_prompt_tokens >= max_len:
            raise ValueError(f"the prompt has {num_prompt_tokens} tokens; this server's max_model_len is "
                             f"{max_len}, and at least one token must be generated")
        if num_prompt_tokens + max_tokens > max_len:
            raise ValueError(f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds this "
                             f"server's max_model_len {max_len}")

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def warm_up(self) -> None:
        """Before serving, in the thread that will run the steps: kernel plans a step would otherwise
        build mid-request (cuDNN's SDPA plans are per shape and per thread)."""
        t0 = time.monotonic()
        n = self.runner.warm_up(self.config.warm_up_ctx, self.config.max_num_batched_tokens)
        if n:
            log.info("warm-up: %d prefill attention shapes and MLP token counts in %.1f s", n, time.monotonic() - t0)

    def abort(self, seq: Sequence) -> None:
        if not seq.is_finished:
            self.scheduler.abort(seq)
            self.runner.release(seq)
            self.stats.requests_aborted += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        if not seq.is_finished:
            self.scheduler.finish(seq, reason)
            self.runner.release(seq)
            self.stats.requests_finished += 1

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or self._ahead is not None

    @property
    def overlaps(self) -> bool:
        """Steps are launched one ahead (`RuntimeConfig.async_scheduling`); never under tensor parallelism,
        whose workers take their inputs from rank 0's host."""
        return self.config.async_scheduling and self.comm is None

    def step(self, on_launch: Callable[[], None] | None = None) -> list[Sequence]:
        """Run one batch; return the sequences that got a token (check `is_finished`).

        `on_launch` runs once the batch is on its way (queued on the GPU: CUDA kernels and graph replays
        return before they finish), while the step waits for its tokens.

        With `overlaps`, the next step is launched before this one's tokens are read, whenever it can be
        known without them (`Scheduler.schedule_ahead`: the next decode of the same sequences), taking its
        input ids from this step's samples on the device. Its host work (scheduling, inputs, launch) then
        runs while the device computes, and the device goes from one step to the next without waiting for
        the host. That step is returned by the next call.

        A failure is contained to the requests it concerns: those end in `self.failed` (aborted, with the
        reason) and the engine keeps serving. Building the inputs and sampling happen on rank 0 alone, so a
        failure there leaves tensor-parallel workers in step; sampling is retried row by row so that one bad
        row fails only its own request. A forward pass that fails under tensor parallelism raises
        `RanksOutOfStep`: the workers may be waiting in a collective rank 0 never joined."""
        self.failed = []
        t0 = time.monotonic()
        cur, self._ahead = self._ahead, None
        if cur is None:
            sched = self.scheduler.schedule(t0)
            for seq in sched.preempted:
                self.runner.release(seq)
            self.idle_step = sched.empty
            if sched.empty:
                return []
            for seq in sched.admitted:
                self.stats.prompt_tokens += seq.num_prompt_tokens
                self.stats.prefix_cache_hits += seq.num_cached_tokens or 0
            cur = self._launch(sched)
            if cur is None:
                return []
        self.idle_step = False
        if self.overlaps and cur.tokens is not None and cur.tokens.device is not None:
            nxt = self.scheduler.schedule_ahead(cur.sched)
            if nxt is not None:
                self._ahead = self._launch(nxt, cur.ahead_ids(nxt))
                self.stats.steps_ahead += self._ahead is not None
        if on_launch is not None:
            on_launch()
        sched, tokens = self._read(cur)
        self.last_sched = sched
        updated = self.scheduler.postprocess(sched, tokens)
        for seq in updated:
            if seq.is_finished:
                self.runner.release(seq)
                self.stats.requests_finished += 1
        dt = time.monotonic() - t0
        if sched.num_prefill_tokens:
            self.scheduler.last_prefill_latency = dt
        st = self.stats
        st.steps += 1
        st.step_seconds += dt
        st.computed_tokens += sched.num_tokens
        st.generation_tokens += len(updated)
        return updated

    def _launch(self, sched: SchedulerOutput, input_ids=None) -> _Launched | None:
        """Build the inputs, run the model and start sampling; None when that failed (requests aborted)."""
        try:
            inp = self.runner.prepare(sched, input_ids)
        except Exception as exc:
            log.exception("building a step's inputs failed; its requests are aborted")
            self._fail([s.seq for s in sched.seqs], exc)
            return None
        if self.comm is not None:
            self.comm.broadcast_step(inp)
        try:
            logits = self.runner.execute(inp)
        except Exception as exc:
            if self.comm is not None:
                raise RanksOutOfStep(f"the forward pass failed on rank 0: {exc}") from exc
            log.exception("a forward pass failed; its requests are aborted")
            self._fail([s.seq for s in sched.seqs], exc)
            return None
        try:
            tokens = self.runner.sample_launch(logits, sched)
        except Exception:
            log.exception("sampling a batch failed; retrying row by row")
            tokens = None
        return _Launched(sched, logits, tokens)

    def _read(self, cur: _Launched) -> tuple[SchedulerOutput, list[int]]:
        """The launched step's tokens; if its batch could not be sampled, row by row, and the rows that
        still fail are aborted and dropped from the step (their KV writes are simply never read)."""
        sched, logits = cur.sched, cur.logits
        if cur.tokens is not None:
            return sched, self.runner.wait_tokens(cur.tokens)
        keep: list[ScheduledSeq] = []
        tokens: list[int] = []
        row = 0
        for s in sched.seqs:
            if not s.samples:
                keep.append(s)
                continue
            try:
                tokens.extend(sample(logits[row : row + 1], [s.seq]))
                keep.append(s)
            except Exception as exc:
                self._fail([s.seq], exc)
            row += 1
        return replace(sched, seqs=keep), tokens

    def _fail(self, seqs: list[Sequence], exc: BaseException) -> None:
        for seq in seqs:
            self.abort(seq)
            self.failed.append((seq, f"engine step failed: {exc}"))

    def generate(self, seqs: list[Sequence]) -> list[Sequence]:
        """Run the given sequences to completion (offline use and tests)."""
        for seq in seqs:
            self.add(seq)
        while self.has_work:
            self.step()
        return seqs

    def shutdown(self) -> None:
        if self.comm is not None:
            self.comm.shutdown()


@dataclass
class Event:
    token: int | None  # None: no token (error or abort)
    finish_reason: str | None
    error: str | None = None
    status: int = 500  # the HTTP status of an error: 400 for a request the engine refuses


class AsyncEngine:
    """Runs LLMEngine.step in a thread; each request gets its events on an asyncio.Queue."""

    def __init__(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop,
                 on_fatal: Callable[[str], None] | None = None):
        self.engine = engine
        self.loop = loop
        self.on_fatal = on_fatal  # called on the event loop when the engine cannot go on (the server exits)
        self._cv = threading.Condition()
        self._inbox: deque[tuple] = deque()
        self._sinks: dict[int, asyncio.Queue] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="k2bench-engine", daemon=True)
        self.fatal: str | None = None
        self.warmed = threading.Event()  # set once the engine thread's warm-up is over (done or failed)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=30)

    def submit(self, seq: Sequence) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self._sinks[seq.seq_id] = q
        self._post(("add", seq))
        return q

    def abort(self, seq: Sequence) -> None:
        self._sinks.pop(seq.seq_id, None)
        self._post(("abort", seq))

    def finish(self, seq: Sequence, reason: str) -> None:
        self._sinks.pop(seq.seq_id, None)
        self._post(("finish", seq, reason))

    def call(self, fn: Callable[[], object]) -> asyncio.Future:
        """Run ``fn`` in the engine thread between two steps (the profiler must start and stop there);
        called on the event loop, whose future gets its result or exception."""
        fut = self.loop.create_future()
        self._post(("call", fn, fut))
        return fut

    def _call(self, fn: Callable[[], object], fut: asyncio.Future) -> None:
        try:
            res, exc = fn(), None
        except Exception as e:  # handed to the caller, never a reason to stop the loop
            res, exc = None, e

        def settle() -> None:
            if not fut.done():
                fut.set_exception(exc) if exc is not None else fut.set_result(res)
        self.loop.call_soon_threadsafe(settle)

    def _post(self, cmd: tuple) -> None:
        with self._cv:
            self._inbox.append(cmd)
            self._cv.notify()

    def _dispatch(self, events: list[tuple[int, Event]]) -> None:
        for seq_id, ev in events:
            q = self._sinks.get(seq_id)
            if q is None:
                continue
            if ev.finish_reason is not None:
                del self._sinks[seq_id]
            q.put_nowait(ev)

    def _run(self) -> None:
        """The engine loop. A step's tokens go to the event loop only once the next step has been launched:
        streaming them (a queue wake-up, an SSE chunk and a socket write per request) then runs while the
        device computes, instead of taking the GIL from this thread's scheduling of the next step. With 128
        streams that handover cost several milliseconds per step (bench/server_step_overhead.py)."""
        eng = self.engine
        try:
            eng.warm_up()
        except Exception:  # slower first steps, not a reason to refuse service
            log.exception("engine warm-up failed; serving without it")
        finally:
            self.warmed.set()
        held = _Held(self)  # the last step's token events, not yet sent
        while True:
            with self._cv:
                idle = not self._inbox and not eng.has_work
            if idle or self._stop:
                held.send()  # nothing will be launched soon: do not sit on tokens
            with self._cv:
                while not self._inbox and not eng.has_work and not self._stop:
                    self._cv.wait()
                if self._stop:
                    held.send()
                    return
                cmds = list(self._inbox)
                self._inbox.clear()
            events: list[tuple[int, Event]] = []
            for cmd in cmds:
                if cmd[0] == "call":
                    self._call(cmd[1], cmd[2])
                    continue
                op, seq = cmd[0], cmd[1]
                try:
                    if op == "add":
                        eng.add(seq)
                    elif op == "abort":
                        eng.abort(seq)
                    else:
                        eng.finish(seq, cmd[2])
                except Exception as exc:  # a request the engine refuses must not stop the loop
                    events.append((seq.seq_id, Event(None, "error", str(exc), status=400)))
            if events:  # refusals go out at once
                self.loop.call_soon_threadsafe(self._dispatch, events)
                events = []
            if eng.has_work:
                try:
                    updated = eng.step(on_launch=held.send)
                except Exception as exc:
                    log.exception("engine step failed")
                    held.send()
                    events.extend(self._fail_all(f"engine step failed: {exc}"))
                    if eng.comm is not None:  # tensor-parallel ranks may be out of step: no further step
                        self._give_up(f"engine step failed: {exc}", events)
                        return
                    updated = []
                # requests the step failed (the others in it go on)
                events.extend((seq.seq_id, Event(None, "error", msg)) for seq, msg in getattr(eng, "failed", ()))
                held.send()  # a step that launched nothing (none schedulable) sends them here
                held.events = [(seq.seq_id, Event(seq.token_ids[-1], seq.finish_reason)) for seq in updated]
                if eng.idle_step:
                    time.sleep(0.001)  # work exists but none is schedulable yet: do not spin
            if events:
                self.loop.call_soon_threadsafe(self._dispatch, events)

    def _give_up(self, msg: str, events: list[tuple[int, Event]]) -> None:
        """Fail every request and hand the server a reason to exit, rather than answer 503 for ever."""
        self.fatal = msg
        self.loop.call_soon_threadsafe(self._dispatch, events)
        if self.on_fatal is not None:
            self.loop.call_soon_threadsafe(self.on_fatal, msg)

    def _fail_all(self, msg: str) -> list[tuple[int, Event]]:
        sch = self.engine.scheduler
        out = []
        for seq in list(sch.running) + list(sch.waiting):
            self.engine.abort(seq)
            out.append((seq.seq_id, Event(None, "error", msg)))
        return out


class _Held:
    """One step's token events, held back until `send` (at most once per batch)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.events: list[tuple[int, Event]] = []

    def send(self) -> None:
        if self.events:
            self.engine.loop.call_soon_threadsafe(self.engine._dispatch, self.events)
            self.events = []
