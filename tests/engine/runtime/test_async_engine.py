"""AsyncEngine's hand-over of tokens to the event loop: a step's tokens are sent once the next step is
launched (so streaming them overlaps the device's work instead of taking the GIL from the scheduling of
that next step), and nothing is held back when no step follows or a step fails."""

from __future__ import annotations

import asyncio
import threading

import pytest

from k2bench.engine.runtime.engine import AsyncEngine
from k2bench.engine.runtime.sequence import SamplingParams, Sequence

pytestmark = pytest.mark.engine


class ScriptedEngine:
    """Stands in for LLMEngine: each step gives every live sequence one token (ids 10, 11, ...), finishing
    at max_tokens, and logs when it launches; `fail_at` makes that step raise after its launch."""

    def __init__(self, log: list, fail_at: int | None = None, warm_up_error: bool = False) -> None:
        self.log = log
        self.fail_at = fail_at
        self.warm_up_error = warm_up_error
        self.live: list[Sequence] = []
        self.steps = 0
        self.idle_step = False
        self.comm = None
        self.scheduler = self  # _fail_all reads .running and .waiting

    @property
    def running(self) -> list[Sequence]:
        return list(self.live)

    waiting: list[Sequence] = []

    @property
    def has_work(self) -> bool:
        return bool(self.live)

    def add(self, seq: Sequence) -> None:
        self.live.append(seq)

    def warm_up(self) -> None:
        self.log.append(("warm_up", threading.current_thread().name))
        if self.warm_up_error:
            raise RuntimeError("no plans today")

    def abort(self, seq: Sequence) -> None:
        seq.finish_reason = "abort"
        self.live.remove(seq)

    def step(self, on_launch=None) -> list[Sequence]:
        self.steps += 1
        n = self.steps
        self.log.append(("launch", n))
        if on_launch is not None:
            on_launch()
        if n == self.fail_at:
            raise RuntimeError("device fault")
        out = list(self.live)
        for seq in out:
            seq.append(9 + n)
            if seq.num_output_tokens >= seq.params.max_tokens:
                seq.finish_reason = "length"
                self.live.remove(seq)
        return out


class _LoggedLoop:
    """The event loop as the engine thread sees it: logs, in that thread and so in order with the launches,
    which tokens each hand-over carries."""

    def __init__(self, loop: asyncio.AbstractEventLoop, log: list) -> None:
        self.loop = loop
        self.log = log

    def call_soon_threadsafe(self, fn, events):
        self.log.append(("sent", sorted({ev.token for _, ev in events}, key=str)))
        return self.loop.call_soon_threadsafe(fn, events)


def run_requests(engine: ScriptedEngine, max_tokens: int, n: int = 2) -> list[list]:
    async def main() -> list[list]:
        loop = asyncio.get_running_loop()
        ae = AsyncEngine(engine, _LoggedLoop(loop, engine.log))
        ae.start()
        queues = [ae.submit(Sequence([1, 2, 3], SamplingParams(max_tokens=max_tokens))) for _ in range(n)]
        got: list[list] = [[] for _ in queues]
        for q, out in zip(queues, got, strict=True):
            while True:
                ev = await asyncio.wait_for(q.get(), 10)
                out.append((ev.token, ev.finish_reason, ev.error))
                if ev.finish_reason is not None:
                    break
        ae.stop()
        return got

    return asyncio.run(main())


def test_tokens_of_a_step_go_out_after_the_next_launch_and_the_last_ones_without_one():
    log: list = []
    got = run_requests(ScriptedEngine(log), max_tokens=3)
    for out in got:
        assert out == [(10, None, None), (11, None, None), (12, "length", None)]
    events = [e for e in log if e[0] in ("launch", "sent")]
    # step 1's tokens (10) leave only once step 2 is launched, 11 once step 3 is; 12 has no step after it
    assert events.index(("sent", [10])) > events.index(("launch", 2))
    assert events.index(("sent", [11])) > events.index(("launch", 3))
    assert ("sent", [12]) in events and ("launch", 4) not in events


def test_a_failing_step_sends_the_held_tokens_before_the_error():
    log: list = []
    got = run_requests(ScriptedEngine(log, fail_at=2), max_tokens=5)
    for out in got:
        assert out[0] == (10, None, None)  # step 1's token, held until step 2 launched, then delivered
        assert out[1][0] is None and out[1][1] == "error" and "device fault" in out[1][2]


def test_warm_up_runs_in_the_engine_thread_before_the_first_step():
    """cuDNN keeps its SDPA plans per thread: warming up anywhere but the thread that runs the steps would
    warm nothing. A warm-up that fails leaves a working (slower) engine."""
    for fails in (False, True):
        log: list = []
        got = run_requests(ScriptedEngine(log, warm_up_error=fails), max_tokens=2, n=1)
        assert got == [[(10, None, None), (11, "length", None)]]
        assert log[0] == ("warm_up", "k2bench-engine")
        assert log.index(("warm_up", "k2bench-engine")) < log.index(("launch", 1))


def test_a_step_failing_under_tensor_parallelism_fails_every_request_and_tells_the_server_to_exit():
    """Ranks may be out of step after it: no further step is taken (it could hang in a collective), and the
    server is told, so that it exits rather than answer 503 for ever."""
    log: list = []
    engine = ScriptedEngine(log, fail_at=2)
    engine.comm = object()  # tensor parallel

    async def main():
        loop = asyncio.get_running_loop()
        told: asyncio.Future = loop.create_future()
        ae = AsyncEngine(engine, loop, on_fatal=told.set_result)
        ae.start()
        queues = [ae.submit(Sequence([1, 2, 3], SamplingParams(max_tokens=5))) for _ in range(2)]
        last = []
        for q in queues:
            while (ev := await asyncio.wait_for(q.get(), 10)).finish_reason is None:
                pass
            last.append(ev)
        reason = await asyncio.wait_for(told, 10)
        ae._thread.join(10)
        return last, reason, ae

    last, reason, ae = asyncio.run(main())
    assert all(ev.finish_reason == "error" and "device fault" in ev.error for ev in last)
    assert "device fault" in reason and ae.fatal == reason
    assert not ae._thread.is_alive() and engine.steps == 2  # no step after the failed one
