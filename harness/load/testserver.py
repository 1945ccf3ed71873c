"""A controllable OpenAI-compatible streaming server with known timing, for tests and benchmarks.

Every number it produces is set on the command line, so a measurement of it can be checked
against the truth: the first token leaves ``ttft_ms`` (plus an optional per-prompt-token
prefill time) after the request arrived, and each later message ``itl_ms`` after the previous
one. Deadlines are absolute (request arrival + offset), so a late wake-up does not push every
later token back. Failure modes (400s, streams that end early, a wrong usage count, a slow
start) let tests check that the load generator reports them.

A load model (all off by default) makes latency grow with load, so that the capacity of the server
at a given SLO can be computed by hand (docs/harness.md, "The load model"):

- ``running`` is the number of streams admitted and not yet finished. With ``--max-running K`` a
  request that arrives while K streams run waits, first come first served, until one finishes;
  that queue time is part of its TTFT.
- The first token leaves ``(ttft_ms + ttft_slope_ms x running) x slower`` after admission, counting
  the request itself in ``running``; each later message leaves ``(itl_ms + itl_slope_ms x running) x
  slower`` after the previous one's deadline, with ``running`` read when that gap starts.
- ``--slower F`` multiplies every time above (a build made F times slower, for regression tests).

So a closed loop of C <= K requests in flight sees TPOT = (itl_ms + itl_slope_ms x C) x slower.

    python -m k2bench.harness.load.testserver --port 8000 --ttft-ms 200 --itl-ms 20

With ``--queue-ms Q`` each request first waits Q ms as if queued, then its TTFT clock starts; with
``--metrics`` it serves vLLM's phase histograms and, with ``--spec-tokens``, speculative-decoding
counters; ``--prefix-cache-blocks N`` models automatic prefix caching; its tokenizer is word-level. What
those models count is in k2bench.harness.load.testserver_models. ``--keep-prompts`` keeps each
request's prompt (``GET /received``), so tests can read what a client sent.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import time
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from k2bench.harness.load.testserver_models import (  # noqa: F401  (VOCAB_SIZE, StreamRecord: importers' names)
    VOCAB_SIZE,
    PhaseMetrics,
    PrefixCache,
    StreamRecord,
    chat_ids,
    detokenize,
    prompt_ids,
    tokenize,
)

# When the last bytes of each connection's current request came off the socket. Deadlines are
# counted from there rather than from when the handler started, so a burst of requests that
# queue in this (single-threaded) server does not shift the truth the client is checked against.
_ARRIVED: dict[int, float] = {}


class _StampedHandler(RequestHandler):
    __slots__ = ()  # same layout as RequestHandler, so an instance can be switched to this class

    def data_received(self, data: bytes) -> None:
        _ARRIVED[id(self)] = time.monotonic()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        _ARRIVED.pop(id(self), None)
        super().connection_lost(exc)


class _StampingServer(web.Server):
    def __call__(self) -> RequestHandler:
        handler = super().__call__()
        handler.__class__ = _StampedHandler
        return handler


@dataclass
class ServerConfig:
    model: str = "k2bench-test"
    ttft_ms: float = 200.0
    itl_ms: float = 20.0
    tokens_per_message: int = 1
    prefill_us_per_token: float = 0.0  # added to TTFT for each prompt token
    fail_status: int = 0  # answer every completion with this HTTP status (0: never)
    fail_every: int = 1  # with fail_status: fail only every k-th request
    end_early_after: int = 0  # close the stream without [DONE] after this many tokens (0: never)
    completion_tokens_delta: int = 0  # report usage.completion_tokens off by this much
    start_delay_s: float = 0.0  # /health and /v1/models answer 503 until this long after start
    max_model_len: int = 1 << 20
    api_key: str | None = None  # require "Authorization: Bearer KEY" (not on /health)
    vocab_size: int = 0  # refuse prompts with token ids >= this, as a real model does (0: any id)
    root: str | None = None  # reported as the model's "root" in /v1/models (vLLM reports its model path)
    kill_after: int = 0  # SIGKILL this process when request kill_after + 1 arrives (0: never), a crash
    queue_ms: float = 0.0  # each request waits this long, as queued, before its TTFT clock starts
    metrics: bool = False  # serve /metrics: vLLM's queue/prefill/decode/inference histograms
    spec_tokens: int = 0  # with metrics: count vLLM's spec_decode counters as if drafting this many per step
    spec_accept_len: float = 0.0  # ... with each verification step yielding this many tokens on average
    # the load model (see the module docstring): latency grows with the streams running
    itl_slope_ms: float = 0.0  # added to each gap per running stream
    ttft_slope_ms: float = 0.0  # added to TTFT per running stream (the request itself included)
    max_running: int = 0  # admit at most this many streams; later ones queue (0: no cap)
    slower: float = 1.0  # multiply every time of the model (ttft, itl, their slopes, prefill)
    slow_every: int = 0  # every k-th request (by arrival number) starts slow_ms later (0: none): a known tail
    slow_ms: float = 0.0  # added to the TTFT of those requests
    prefix_cache_blocks: int = 0  # blocks the prefix-cache model holds (0: no prefix cache)
    cache_block_size: int = 16  # tokens per cached block
    cache_metrics: bool = True  # with the cache model: expose its counters on /metrics
    keep_prompts: bool = False  # keep every request's prompt for GET /received


def _error(status: int, message: str) -> web.Response:
    body = {"object": "error", "message": message, "type": "BadRequestError", "code": status}
    return web.json_response(body, status=status)


class TestServer:
    """The aiohttp application and its counters (requests seen, currently streaming)."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.started = time.monotonic()
        self.requests = 0
        self.active = 0
        self.max_active = 0
        self.running = 0  # streams admitted by the load model and not finished
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()  # the --max-running queue
        self.late_ms: list[float] = []  # how late each message left against its deadline (capped sample)
        # what each completed stream actually did: the truth a client's measurement is checked against
        self.done: list[StreamRecord] = []
        self.phases = PhaseMetrics(config.spec_tokens, config.spec_accept_len) if config.metrics else None
        self.cache = PrefixCache(config.prefix_cache_blocks, config.cache_block_size) \
            if config.prefix_cache_blocks else None
        self.received: list[dict] = []  # with keep_prompts: {"number", "prompt" or "messages"} of each request

    def routes(self) -> dict[tuple[str, str], object]:
        return {("GET", "/health"): self.health, ("GET", "/v1/models"): self.models,
                ("POST", "/v1/completions"): self.completions, ("POST", "/tokenize"): self.tokenize,
                ("POST", "/detokenize"): self.detokenize, ("GET", "/stats"): self.stats,
                ("POST", "/v1/chat/completions"): self.completions, ("GET", "/received"): self.show_received,
                **({("GET", "/metrics"): self.metrics}
                   if self.phases is not None or (self.cache and self.config.cache_metrics) else {})}

    async def show_received(self, request: web.BaseRequest) -> web.Response:
        return web.json_response(self.received)

    async def dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        handler = self._routes.get((request.method, request.path))
        if handler is None:
            return _error(404, f"no route {request.method} {request.path}")
        key = self.config.api_key
        if key and request.path != "/health" and request.headers.get("Authorization") != f"Bearer {key}":
            return _error(401, "invalid or missing API key")
        return await handler(request)

    async def serve(self, host: str, port: int, reuse_port: bool = False, record: str | None = None) -> None:
        """Serve until SIGINT/SIGTERM (aiohttp's low-level server: the routes are few). ``reuse_port``
        lets several server processes share the port (the kernel spreads connections over them), for a
        load one process cannot carry; ``record`` is a file each stream's record is written to at exit,
        the truth of every process when /stats reaches only one of them."""
        import signal

        self._routes = self.routes()
        loop = asyncio.get_running_loop()
        stop = loop.create_future()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
        server = _StampingServer(self.dispatch, access_log=None)
        tcp = await loop.create_server(server, host, port, backlog=4096, reuse_address=True, reuse_port=reuse_port)
        try:
            await stop
        finally:
            tcp.close()
            await server.shutdown(1.0)
            if record:
                with open(record, "w") as f:
                    json.dump({"late_ms": self.late_ms[:100_000], "streams": [d._asdict() for d in self.done]}, f)

    def _ready(self) -> bool:
        return time.monotonic() - self.started >= self.config.start_delay_s

    async def health(self, request: web.BaseRequest) -> web.Response:
        return web.Response(text="ok") if self._ready() else web.Response(status=503, text="starting")

    async def models(self, request: web.BaseRequest) -> web.Response:
        if not self._ready():
            return web.Response(status=503, text="starting")
        model = {"id": self.config.model, "object": "model", "owned_by": "k2bench",
                 "max_model_len": self.config.max_model_len}
        if self.config.root:
            model["root"] = self.config.root
        return web.json_response({"object": "list", "data": [model]})

    async def stats(self, request: web.BaseRequest) -> web.Response:
        """Counters, message lateness, and (``?from=N``) what the streams of requests >= N did.

        ``actual`` is measured here, at the server: TTFT from the request's last byte arriving to
        the first message leaving, TPOT as (last - first message) / (tokens - 1) for streams of one
        token per message, and the span from the first arrival to the last message. ``&streams=1``
        adds each stream's record, so a client can be checked request by request."""
        late = sorted(self.late_ms)

        def q(values: list[float], f: float) -> float | None:
            return round(values[min(len(values) - 1, int(f * len(values)))], 3) if values else None

        body = {"requests": self.requests, "active": self.active, "max_active": self.max_active,
                "late_p50_ms": q(late, 0.5), "late_p99_ms": q(late, 0.99), "late_max_ms": q(late, 1.0)}
        try:
            start = int(request.query.get("from", "0"))
        except ValueError:
            return _error(400, "from must be an integer request number")
        done = [d for d in self.done if d.number >= start]
        ttft = sorted((d.first_sent - d.arrived) * 1e3 for d in done)
        tpot = sorted((d.last_sent - d.first_sent) * 1e3 / (d.messages - 1) for d in done
                      if d.messages > 1 and d.messages == d.tokens)
        body["actual"] = {
            "streams": len(done), "output_tokens": sum(d.tokens for d in done),
            "ttft_p50_ms": q(ttft, 0.5), "tpot_p50_ms": q(tpot, 0.5),
            "span_s": (max(d.last_sent for d in done) - min(d.arrived for d in done)) if done else None,
        }
        if request.query.get("streams"):
            body["streams"] = [d._asdict() for d in done]
        return web.json_response(body)

    async def metrics(self, request: web.BaseRequest) -> web.Response:
        """/metrics: the phase histograms (--metrics) and the prefix-cache model's counters, as configured."""
        body = self.phases.exposition() if self.phases is not None else b""
        if self.cache is not None and self.config.cache_metrics:
            body += self.cache.exposition()
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def tokenize(self, request: web.BaseRequest) -> web.Response:
        body = await request.json()
        ids = prompt_ids(body.get("prompt", ""))
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": self.config.max_model_len})

    async def detokenize(self, request: web.BaseRequest) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": detokenize(body.get("tokens", []))})

    async def completions(self, request: web.BaseRequest) -> web.StreamResponse:
        arrived = _ARRIVED.get(id(request.protocol), time.monotonic())
        cfg = self.config
        self.requests += 1
        n = self.requests
        if cfg.kill_after and n > cfg.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error(400, "request body is not JSON")
        if cfg.fail_status and n % max(cfg.fail_every, 1) == 0:
            return _error(cfg.fail_status, f"test server configured to fail request {n}")
        chat = request.path.endswith("/chat/completions")
        try:
            prompt = chat_ids(body.get("messages")) if chat else prompt_ids(body.get("prompt"))
        except ValueError as exc:
            return _error(400, str(exc))
        if cfg.keep_prompts and len(self.received) < 100_000:
            self.received.append({"number": n, **({"messages": body["messages"]} if chat
                                                  else {"prompt": body.get("prompt")})})
        bad = next((t for t in prompt if cfg.vocab_size and not 0 <= t < cfg.vocab_size), None)
        if bad is not None:
            return _error(400, f"token id {bad} is outside the vocabulary (0..{cfg.vocab_size - 1})")
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, "max_tokens must be a positive integer")
        if len(prompt) + max_tokens > cfg.max_model_len:
            return _error(400, f"prompt ({len(prompt)}) + max_tokens ({max_tokens}) exceeds "
                               f"max_model_len {cfg.max_model_len}")
        if not body.get("stream"):
            return _error(400, "this test server only streams (set stream=true)")
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        cached = self.cache.lookup_and_insert(prompt) if self.cache else None

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            admitted = await self._admit(arrived)
            try:
                await self._stream(resp, request.transport, arrived, admitted, len(prompt), max_tokens,
                                   include_usage, n, cached, chat)
            finally:
                self._release()
        finally:
            self.active -= 1
        return resp

    async def _admit(self, arrived: float) -> float:
        """Wait for a running slot under --max-running (first come, first served); when admitted."""
        cap = self.config.max_running
        if cap and (self.running >= cap or self.waiting):
            turn = asyncio.get_running_loop().create_future()
            self.waiting.append(turn)
            try:
                await turn  # _release hands this request the slot it frees: running is not decremented
            except asyncio.CancelledError:
                if turn in self.waiting:
                    self.waiting.remove(turn)
                elif turn.done() and not turn.cancelled():  # it was handed a slot: pass it on
                    self._release()
                raise
            return time.monotonic()
        self.running += 1
        return arrived

    def _release(self) -> None:
        """A stream ended: its slot goes to the oldest waiting request, else becomes free."""
        while self.waiting:
            turn = self.waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.running -= 1

    async def _stream(self, resp: web.StreamResponse, transport: asyncio.BaseTransport | None, arrived: float,
                      admitted: float, prompt_len: int, max_tokens: int, include_usage: bool, n: int,
                      cached: int | None = None, chat: bool = False) -> None:
        cfg = self.config
        f = cfg.slower
        running_at_admission = self.running
        scheduled = admitted + cfg.queue_ms / 1e3  # the --max-running wait, then the fixed --queue-ms one
        # prefill is charged for the tokens the prefix-cache model did not hold
        first = scheduled + f * ((cfg.ttft_ms + cfg.ttft_slope_ms * self.running) / 1e3
                                 + (prompt_len - (cached or 0)) * cfg.prefill_us_per_token / 1e6)
        if cfg.slow_every and n % cfg.slow_every == 0:
            first += cfg.slow_ms / 1e3
        k = max(cfg.tokens_per_message, 1)
        if chat:
            head = (f'data: {{"id":"chat-{n}","object":"chat.completion.chunk","created":0,"model":"{cfg.model}",'
                    f'"choices":[{{"index":0,"delta":{{"content":"')
        else:
            head = f'data: {{"id":"cmpl-{n}","object":"text_completion","created":0,"model":"{cfg.model}","choices":[{{"index":0,"text":"'
        close = '"}' if chat else '"'
        sent = 0
        message = 0
        first_sent = 0.0
        late_ms = self.late_ms
        due = first
        while sent < max_tokens:
            count = min(k, max_tokens - sent)
            if message:  # the gap starts at the previous deadline, priced at the streams running now
                due += f * (cfg.itl_ms + cfg.itl_slope_ms * self.running) / 1e3
            # uvloop's timers count whole milliseconds and may wake a little early: sleep again
            # until the deadline has really passed, so the configured timing is a floor
            while (delay := due - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            if cfg.end_early_after and sent + count > cfg.end_early_after:
                if transport is not None:  # drop the connection mid-stream: no [DONE], no usage
                    transport.close()
                return
            now = time.monotonic()
            if len(late_ms) < 1_000_000:
                late_ms.append((now - due) * 1e3)
            if message == 0:
                first_sent = now
            text = "".join(f" t{(n * 7919 + sent + i) % VOCAB_SIZE}" for i in range(count))
            sent += count
            message += 1
            finish = '"length"' if sent == max_tokens else "null"
            await resp.write(f'{head}{text}{close},"logprobs":null,"finish_reason":{finish}}}],"usage":null}}\n\n'.encode())
        record = StreamRecord(n, arrived, first_sent, now, message, sent, prompt_len, scheduled=scheduled,
                              admitted=admitted, running=running_at_admission, first_due=first, last_due=due)
        if len(self.done) < 1_000_000:
            self.done.append(record)
        if self.phases is not None:  # before the stream ends, so a scrape after the client's end sees it
            self.phases.observe(record)
        if include_usage:
            completion = max(max_tokens + cfg.completion_tokens_delta, 0)
            usage = {"prompt_tokens": prompt_len, "completion_tokens": completion,
                     "total_tokens": prompt_len + completion}
            if cached is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            tail = {"id": f"cmpl-{n}", "object": "text_completion", "created": 0, "model": cfg.model,
                    "choices": [], "usage": usage}
            await resp.write(b"data: " + json.dumps(tail).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m k2bench.harness.load.testserver", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default=ServerConfig.model)
    p.add_argument("--ttft-ms", type=float, default=ServerConfig.ttft_ms)
    p.add_argument("--itl-ms", type=float, default=ServerConfig.itl_ms, help="gap between messages")
    p.add_argument("--tokens-per-message", type=int, default=ServerConfig.tokens_per_message)
    p.add_argument("--prefill-us-per-token", type=float, default=ServerConfig.prefill_us_per_token)
    p.add_argument("--fail-status", type=int, default=0, help="answer completions with this HTTP status")
    p.add_argument("--fail-every", type=int, default=1, help="with --fail-status: only every k-th request")
    p.add_argument("--end-early-after", type=int, default=0, help="drop the stream after this many tokens")
    p.add_argument("--completion-tokens-delta", type=int, default=0, help="misreport usage by this much")
    p.add_argument("--start-delay-s", type=float, default=0.0, help="stay unready this long")
    p.add_argument("--max-model-len", type=int, default=ServerConfig.max_model_len)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    p.add_argument("--vocab-size", type=int, default=0, help="refuse token ids >= this with HTTP 400 (0: any)")
    p.add_argument("--root", default=None, help="the model folder /v1/models reports as the model's root")
    p.add_argument("--kill-after", type=int, default=0, help="SIGKILL itself when request N + 1 arrives")
    p.add_argument("--queue-ms", type=float, default=0.0, help="hold each request this long, as queued, "
                   "before its TTFT clock starts")
    p.add_argument("--metrics", action="store_true", help="serve /metrics with vLLM's queue, prefill, decode "
                   "and inference histograms")
    p.add_argument("--spec-tokens", type=int, default=0, help="with --metrics: count vLLM's spec_decode counters "
                   "as if drafting K tokens per step")
    p.add_argument("--spec-accept-len", type=float, default=0.0, help="with --spec-tokens: tokens each "
                   "verification step yields (1..K+1)")
    p.add_argument("--itl-slope-ms", type=float, default=0.0, help="load model: each gap grows this much per "
                   "running stream")
    p.add_argument("--ttft-slope-ms", type=float, default=0.0, help="load model: TTFT grows this much per "
                   "running stream")
    p.add_argument("--max-running", type=int, default=0, help="load model: streams served at once; later "
                   "requests queue, and the wait is part of their TTFT (0: no cap)")
    p.add_argument("--slower", type=float, default=1.0, help="multiply every time of the model (a slower build)")
    p.add_argument("--slow-every", type=int, default=0, help="every k-th request (by arrival) is slow (0: none)")
    p.add_argument("--slow-ms", type=float, default=0.0, help="with --slow-every: extra TTFT of those requests")
    p.add_argument("--prefix-cache-blocks", type=int, default=0, help="model a prefix cache of N blocks (0: none)")
    p.add_argument("--cache-block-size", type=int, default=ServerConfig.cache_block_size, help="tokens per block")
    p.add_argument("--no-cache-metrics", action="store_true", help="no /metrics for the cache model (usage only)")
    p.add_argument("--keep-prompts", action="store_true", help="keep each request's prompt for GET /received")
    p.add_argument("--cpu", type=int, default=None, help="pin the server to this CPU core")
    p.add_argument("--reuse-port", action="store_true", help="share the port with other test-server processes")
    p.add_argument("--record", default=None, help="write each stream's record to this JSON file at exit")
    return p


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        model=args.model, ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, tokens_per_message=args.tokens_per_message,
        prefill_us_per_token=args.prefill_us_per_token, fail_status=args.fail_status, fail_every=args.fail_every,
        end_early_after=args.end_early_after, completion_tokens_delta=args.completion_tokens_delta,
        start_delay_s=args.start_delay_s, max_model_len=args.max_model_len, api_key=args.api_key,
        vocab_size=args.vocab_size, root=args.root, kill_after=args.kill_after, queue_ms=args.queue_ms,
        metrics=args.metrics, spec_tokens=args.spec_tokens, spec_accept_len=args.spec_accept_len,
        itl_slope_ms=args.itl_slope_ms, ttft_slope_ms=args.ttft_slope_ms, max_running=args.max_running,
        slower=args.slower, slow_every=args.slow_every, slow_ms=args.slow_ms,
        prefix_cache_blocks=args.prefix_cache_blocks, cache_block_size=args.cache_block_size,
        cache_metrics=not args.no_cache_metrics, keep_prompts=args.keep_prompts,
    )


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.spec_tokens and not 1.0 <= args.spec_accept_len <= args.spec_tokens + 1:
        parser.error(f"--spec-accept-len must be from 1 to --spec-tokens + 1 ({args.spec_tokens + 1})")
    if args.slower <= 0 or args.max_running < 0 or args.itl_slope_ms < 0 or args.ttft_slope_ms < 0:
        parser.error("--slower must be positive; --max-running, --itl-slope-ms and --ttft-slope-ms not negative")
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    from k2bench.harness.load.loadgen import run

    run(TestServer(config_from_args(args)).serve(args.host, args.port, args.reuse_port, args.record))


if __name__ == "__main__":
    main()
