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

from k2bench.engine.runtime.runner import ModelRunner
from k2bench.engine.runtime.sampling import sample
from k2bench.engine.runtime.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from k2bench.engine.runtime.sequence import Sequence

log = logging.getLogger(__name__)


class RanksOutOfStep(RuntimeError):
    """Rank 0 failed where tensor-parallel workers may already be inside a collective: not recoverable."""


@dataclass
class EngineStats:
    prompt_tokens: int = 0  # prompt tokens of requests that were admitted at least once (prefix-cache queries)
    prefix_cache_hits: int = 0  # of those, tokens found in the prefix cache at first admission
    computed_tokens: int = 0  # tokens the model ran (prefill, recompute and decode)
    generation_tokens: int = 0
    steps: int = 0
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
        n = self.runner.warm_up(self.config.warm_up_ctx)
        if n:
            log.info("warm-up: %d prefill attention shapes in %.1f s", n, time.monotonic() - t0)

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
        return self.scheduler.has_work

    def step(self, on_launch: Callable[[], None] | None = None) -> list[Sequence]:
        """Run one batch; return the sequences that got a token (check `is_finished`).

        `on_launch` runs once the batch is on its way (queued on the GPU: CUDA kernels and graph replays
        return before they finish), while the step waits for its tokens.

        A failure is contained to the requests it concerns: those end in `self.failed` (aborted, with the
        reason) and the engine keeps serving. Building the inputs and sampling happen on rank 0 alone, so a
        failure there leaves tensor-parallel workers in step; sampling is retried row by row so that one bad
        row fails only its own request. A forward pass that fails under tensor parallelism raises
        `RanksOutOfStep`: the workers may be waiting in a collective rank 0 never joined."""
        self.failed = []
        t0 = time.monotonic()
        sched = self.scheduler.schedule(t0)
        for seq in sched.preempted:
            self.runner.release(seq)
        self.idle_step = sched.empty
        if sched.empty:
            return []
        st = self.stats
        for seq in sched.admitted:
            st.prompt_tokens += seq.num_prompt_tokens
            st.prefix_cache_hits += seq.num_cached_tokens or 0
        try:
            inp = self.runner.prepare(sched)
        except Exception as exc:
            log.exception("building a step's inputs failed; its requests are aborted")
            self._fail([s.seq for s in sched.seqs], exc)
            return []
        if self.comm is not None:
            self.comm.broadcast_step(inp)
        try:
            logits = self.runner.execute(inp)
        except Exception as exc:
            if self.comm is not None:
                raise RanksOutOfStep(f"the forward pass failed on rank 0: {exc}") from exc
            log.exception("a forward pass failed; its requests are aborted")
            self._fail([s.seq for s in sched.seqs], exc)
            return []
        if on_launch is not None:
            on_launch()
        sched, tokens = self._sample(logits, sched)
        updated = self.scheduler.postprocess(sched, tokens)
        for seq in updated:
            if seq.is_finished:
                self.runner.release(seq)
                self.stats.requests_finished += 1
        dt = time.monotonic() - t0
        if sched.num_prefill_tokens:
            self.scheduler.last_prefill_latency = dt
        st.steps += 1
        st.step_seconds += dt
        st.computed_tokens += sched.num_tokens
        st.generation_tokens += len(updated)
        return updated

    def _sample(self, logits, sched: SchedulerOutput) -> tuple[SchedulerOutput, list[int]]:
        """The batch's tokens; if the batch fails, row by row, and the rows that still fail are aborted
        and dropped from the step (their KV writes are simply never read)."""
        try:
            return sched, self.runner.sample(logits, sched)
        except Exception:
            log.exception("sampling a batch failed; retrying row by row")
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
