"""Conversations under a closed loop: a session is one user, so the concurrency counts sessions.

Turn k of a session sends the whole history as chat messages: each earlier user message and the answer
the server actually streamed back for it, then the next user message. Between a turn's last token and
the next turn's send, the session waits ``think_time_s`` (not part of any request's time). Warmup
sessions all finish before the measured ones start, as requests do in `loadgen.run_level`; every turn
is one RequestRecord carrying its session and turn.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Sequence

from k2bench.errors import ServerError
from k2bench.harness.load.level_watch import LevelWatch
from k2bench.harness.load.loadgen import CHAT, LevelSpec, make_session, request_body, send_one
from k2bench.harness.load.records import RequestRecord
from k2bench.net import normalize_base_url
from k2bench.workloads.build import Session
from k2bench.workloads.prompts import Prompt


async def run_sessions(spec: LevelSpec, sessions: Sequence[Session], num_warmup: int, think_time_s: float = 0.0,
                       on_done: Callable[[RequestRecord], None] | None = None, watch: LevelWatch | None = None,
                       on_window: tuple[Callable[[], None], Callable[[], None]] | None = None) -> list[RequestRecord]:
    """Run the first ``num_warmup`` sessions as warmup, then the rest, ``spec.concurrency`` sessions at a time.
    Returns the records of every turn that was sent (warmup first), in the order turns were numbered."""
    watch = watch or LevelWatch()
    url = normalize_base_url(spec.base_url) + CHAT
    records: list[RequestRecord] = []
    counter = iter(range(1 << 62))

    async def converse(session_no: int, s: Session, warmup: bool, http) -> None:
        history: list[dict] = []
        for k, (user, olen, ilen) in enumerate(zip(s.user, s.output_lens, s.input_lens, strict=True)):
            if watch.stopped is not None:
                return
            if k and think_time_s:
                await asyncio.sleep(think_time_s)
            history.append({"role": "user", "content": user})
            rec = RequestRecord(index=next(counter), concurrency=spec.concurrency, warmup=warmup,
                                requested_input_tokens=ilen, requested_output_tokens=olen, send_ns=0,
                                session=session_no, turn=k + 1)
            records.append(rec)
            answer: list[str] = []
            body = request_body(spec.model, Prompt(input_len=ilen, output_len=olen, text=user, chat=True),
                                spec.extra_body, messages=history)
            await send_one(http, url, body, rec, spec.timeout_s, watch, on_done, answer)
            if not rec.success:
                return  # a conversation cannot go on without the answer it builds on
            history.append({"role": "assistant", "content": "".join(answer)})

    async def loop(batch: list[tuple[int, Session]], warmup: bool, http) -> None:
        queue = iter(batch)

        async def worker() -> None:
            for number, s in queue:
                if watch.stopped is not None:
                    return
                await converse(number, s, warmup, http)

        watch._tasks = [asyncio.ensure_future(worker()) for _ in range(min(spec.concurrency, len(batch)))]
        for result in await asyncio.gather(*watch._tasks, return_exceptions=True):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result

    numbered = list(enumerate(sessions))
    deadline = None if watch.timeout_s is None else time.monotonic_ns() + int(watch.timeout_s * 1e9)
    watcher = asyncio.ensure_future(watch.watch(deadline))
    gc.collect()
    gc.disable()
    try:
        async with make_session(spec.timeout_s, spec.api_key, url) as http:
            if num_warmup:
                await loop(numbered[:num_warmup], True, http)
                if watch.stopped is None and not any(r.success for r in records):
                    raise ServerError(f"every warmup request failed; first error: {records[0].error}")
            if watch.stopped is None:
                if on_window is not None:
                    await asyncio.to_thread(on_window[0])
                try:
                    await loop(numbered[num_warmup:], False, http)
                finally:
                    if on_window is not None:
                        await asyncio.to_thread(on_window[1])
    finally:
        gc.enable()
        watcher.cancel()
    return [r for r in records if r.send_ns]
