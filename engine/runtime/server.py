"""OpenAI-compatible HTTP server (aiohttp) in front of the engine thread.

Each request becomes one Sequence; its tokens arrive on an asyncio.Queue, one event per
engine step, and are sent as one SSE message each (so client-side ITL is the step time). A
request whose client goes away is aborted, which frees its KV blocks at the engine's next step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from k2bench.engine.runtime import server_metrics
from k2bench.engine.runtime.engine import AsyncEngine, LLMEngine
from k2bench.engine.runtime.profiler import ProfileEndpoints, apply_test_delay
from k2bench.engine.runtime.protocol import (
    RequestError,
    StopStrings,
    parse_common,
    parse_messages,
    parse_prompt,
)
from k2bench.engine.runtime.sequence import Sequence
from k2bench.engine.runtime.server_limits import ConnectionGuard, ServerLimits, longest_token_bytes
from k2bench.engine.runtime.server_process import Stalls
from k2bench.engine.runtime.tokenizer import Detokenizer, Tokenizer, TokenizerError

log = logging.getLogger(__name__)

try:
    import orjson

    def _dumps(obj) -> bytes:
        return orjson.dumps(obj)
except ImportError:  # pragma: no cover
    def _dumps(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


class EngineFailed(RuntimeError):
    """The engine cannot take another step (tensor-parallel ranks out of step): the server exits."""


def _no_constants(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _loads(raw: bytes) -> dict:
    try:
        body = json.loads(raw, parse_constant=_no_constants)  # NaN and Infinity are not JSON
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def error_response(message: str, status: int = 400, param: str | None = None, code: str | None = None,
                   etype: str = "invalid_request_error") -> web.Response:
    body = {"error": {"message": message, "type": etype, "param": param, "code": code}}
    return web.Response(body=_dumps(body), status=status, content_type="application/json")


class OpenAIServer:
    def __init__(self, engine: LLMEngine, tokenizer: Tokenizer | None, served_name: str,
                 api_key: str | None = None, root: str | None = None, limits: ServerLimits | None = None,
                 stalls: Stalls | None = None):
        self.engine = engine
        self.tok = tokenizer
        self.names = (served_name,)
        self.root = root  # the model folder, listed as "root" (as vLLM does) so clients find its tokenizer
        self.api_key = api_key
        self.async_engine: AsyncEngine | None = None
        self.prom = server_metrics.ServerMetrics(engine, stalls)
        apply_test_delay(engine)  # tests only: K2BENCH_TEST_SLOW
        self.profile = ProfileEndpoints(self)  # /start_profile, /stop_profile
        self.created = int(time.time())
        self.vocab_size = getattr(engine, "model_config", None) and engine.model_config.vocab_size or (
            tokenizer.vocab_size if tokenizer else 1 << 31)
        self.limits = limits or ServerLimits()
        self.token_bytes = longest_token_bytes(tokenizer)
        self.max_body = self.limits.body_limit(engine.config.max_model_len, self.token_bytes)
        self.guard: ConnectionGuard | None = None  # set by `serve` once the listening socket exists
        self.on_fatal = None  # set by `serve`: the engine cannot go on
        # JSON parsing and tokenising off the event loop (so /health answers meanwhile), two at a time
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="k2bench-tokenize")

    # ---- app ---------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=self.max_body)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        self.profile.add_routes(app)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app) -> None:
        self.async_engine = AsyncEngine(self.engine, asyncio.get_running_loop(), on_fatal=self._fatal)
        self.async_engine.start()
        # the port opens (and the server says it is ready) once the engine thread has warmed up
        await asyncio.get_running_loop().run_in_executor(None, self.async_engine.warmed.wait)

    async def _stop(self, app) -> None:
        if self.async_engine is not None:
            self.async_engine.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _fatal(self, message: str) -> None:
        if self.on_fatal is not None:
            self.on_fatal(message)

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        if self.api_key and request.path not in ("/health",):
            sent = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(sent, f"Bearer {self.api_key}".encode()):
                return error_response("invalid or missing API key", 401, code="invalid_api_key",
                                      etype="authentication_error")
        conn = self.guard.started(request.transport) if self.guard is not None else None
        try:
            return await handler(request)
        except RequestError as exc:
            resp = error_response(str(exc), exc.status, exc.param, exc.code)
            if exc.status in (408, 413):  # the rest of the body is not worth waiting for
                resp.force_close()
            return resp
        except TokenizerError as exc:
            return error_response(str(exc), 400)
        except web.HTTPException:
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:  # the server must survive anything a request does
            log.exception("request failed")
            return error_response(f"internal error: {exc}", 500, etype="server_error")
        finally:
            if conn is not None:
                conn.request_done()

    # ---- simple endpoints ---------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        fatal = self.async_engine.fatal if self.async_engine else None
        if fatal:
            return web.Response(text=fatal, status=503)
        return web.Response(text="ok")

    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": n, "object": "model", "created": self.created, "owned_by": "k2bench",
                 "max_model_len": self.engine.config.max_model_len} for n in self.names]
        for entry in data:
            if self.root:
                entry["root"] = self.root
        return web.json_response({"object": "list", "data": data})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.prom.render(), headers={"Content-Type": server_metrics.CONTENT_TYPE})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        if "messages" in body:
            ids = await self._off_loop(self._chat_ids, body)
        else:
            ids = await self._off_loop(self._prompt_ids, body)
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": self.engine.config.max_model_len})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        return web.json_response({"prompt": await self._off_loop(self._decode, body)})

    def _decode(self, body: dict) -> str:
        ids = parse_prompt({"prompt": body.get("tokens")}, self.vocab_size)
        if isinstance(ids, str):
            raise RequestError("'tokens' must be a list of token ids", "tokens")
        if len(ids) > self.engine.config.max_model_len:
            raise RequestError(f"'tokens' has {len(ids)} ids, more than this server's max_model_len", "tokens")
        return self._need_tok().decode(ids, skip_special=False)

    # ---- generation ---------------------------------------------------------------------------
    async def _json(self, request: web.Request) -> dict:
        """The body, read within the request deadline and within the size limit, parsed off the loop."""
        t = self.limits.request_timeout
        if request.content_length is not None and request.content_length > self.max_body:
            raise self._too_large()
        try:
            raw = await asyncio.wait_for(request.read(), t)
        except asyncio.TimeoutError:
            raise RequestError(f"the request body did not arrive within {t:g} s", status=408,
                               code="request_timeout") from None
        except web.HTTPRequestEntityTooLarge:
            raise self._too_large() from None
        return await self._off_loop(_loads, raw)

    def _too_large(self) -> RequestError:
        return RequestError(f"the request body exceeds this server's limit of {self.max_body} bytes "
                            f"(max_model_len {self.engine.config.max_model_len} tokens)", status=413,
                            code="request_too_large")

    async def _off_loop(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _need_tok(self) -> Tokenizer:
        if self.tok is None:
            raise RequestError("this model has no tokenizer: send token-id prompts")
        return self.tok

    def _encode(self, text: str, add_special: bool = True) -> list[int]:
        """Refuses a text too long to fit before spending time on it: no token covers more than
        `token_bytes` bytes, so a longer text has more than max_model_len tokens."""
        max_len = self.engine.config.max_model_len
        n = len(text.encode("utf-8", "surrogatepass"))
        if n > max_len * self.token_bytes:
            raise RequestError(f"the prompt has {n} bytes, more than this server's max_model_len {max_len} tokens "
                               f"can hold (at most {self.token_bytes} bytes per token)", "prompt",
                               "context_length_exceeded")
        ids = self._need_tok().encode(text, add_special)
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:  # a tokenizer larger than the model's embedding
            raise RequestError(f"the prompt encodes to token id {bad}, outside the model's vocabulary", "prompt")
        return ids

    def _prompt_ids(self, body: dict) -> list[int]:
        prompt = parse_prompt(body, self.vocab_size)
        return self._encode(prompt, _special(body)) if isinstance(prompt, str) else prompt

    def _chat_ids(self, body: dict) -> list[int]:
        text = self._need_tok().apply_chat_template(parse_messages(body))
        return self._encode(text, add_special=False)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        req = parse_common(body, self.names, default_max_tokens=16, vocab_size=self.vocab_size)
        ids = await self._off_loop(self._prompt_ids, body)
        return await self._generate(request, ids, req, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        req = parse_common(body, self.names, default_max_tokens=None, vocab_size=self.vocab_size)
        ids = await self._off_loop(self._chat_ids, body)
        return await self._generate(request, ids, req, chat=True)

    async def _generate(self, request: web.Request, ids: list[int], req, chat: bool) -> web.StreamResponse:
        if req.max_tokens is None:
            req.params.max_tokens = max(1, self.engine.config.max_model_len - len(ids))
            if req.params.min_tokens > req.params.max_tokens:
                raise RequestError(f"min_tokens ({req.params.min_tokens}) exceeds the room left after the "
                                   f"prompt ({req.params.max_tokens})", "min_tokens", "context_length_exceeded")
        try:
            self.engine.check(len(ids), req.params.max_tokens)
        except ValueError as exc:
            raise RequestError(str(exc), "max_tokens" if len(ids) < self.engine.config.max_model_len else "prompt",
                               "context_length_exceeded") from None
        if self.async_engine is None or self.async_engine.fatal:
            return error_response("the engine is not running", 503, etype="server_error")
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        seq = Sequence(ids, req.params, request_id=rid)
        detok = Detokenizer(self.tok, ids) if self.tok is not None else None
        stops = StopStrings(req.stop)
        timer = self.prom.request(seq)
        queue = self.async_engine.submit(seq)
        stream = _Stream(self, request, rid, chat, req.include_usage) if req.stream else None
        pieces: list[str] = []
        finish = None
        try:
            if stream is not None:
                await stream.open()
            while finish is None:
                ev = await queue.get()
                if ev.error is not None:
                    if stream is None:
                        return error_response(ev.error, ev.status,
                                              etype="invalid_request_error" if ev.status < 500 else "server_error")
                    await stream.error(ev.error)
                    return stream.resp
                if ev.token is not None:
                    timer.token()
                text = detok.push(ev.token) if (detok is not None and ev.token is not None) else ""
                text, hit = stops.feed(text)
                finish = ev.finish_reason
                if hit:
                    finish = "stop"
                    self.async_engine.finish(seq, "stop")
                elif finish is not None:
                    text += stops.feed(detok.flush())[0] if detok is not None else ""
                    text += stops.flush()
                if stream is not None:
                    await stream.token(text, ev.token, finish)
                else:
                    pieces.append(text)
            timer.finished()
            usage = {"prompt_tokens": len(ids), "completion_tokens": seq.num_output_tokens,
                     "total_tokens": len(ids) + seq.num_output_tokens,
                     "prompt_tokens_details": {"cached_tokens": seq.num_cached_tokens or 0}}
            if stream is not None:
                await stream.close(usage)
                return stream.resp
            text = "".join(pieces)
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                          "logprobs": None}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            return web.Response(body=_dumps({
                "id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.names[0], "choices": [choice], "usage": usage}), content_type="application/json")
        finally:
            if not seq.is_finished and finish is None:
                self.async_engine.abort(seq)  # client gone or handler failed: free the blocks


def _special(body: dict) -> bool:
    v = body.get("add_special_tokens", True)
    if not isinstance(v, bool):
        raise RequestError("'add_special_tokens' must be a boolean", "add_special_tokens")
    return v


class _Stream:
    """Server-sent events in the OpenAI chunk format."""

    def __init__(self, srv: OpenAIServer, request: web.Request, rid: str, chat: bool, include_usage: bool):
        self.srv, self.request, self.rid, self.chat, self.include_usage = srv, request, rid, chat, include_usage
        self.created = int(time.time())
        self.obj = "chat.completion.chunk" if chat else "text_completion"
        self.resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})

    def _chunk(self, choices: list, **extra) -> bytes:
        body = {"id": self.rid, "object": self.obj, "created": self.created, "model": self.srv.names[0],
                "choices": choices, **extra}
        return b"data: " + _dumps(body) + b"\n\n"

    async def open(self) -> None:
        await self.resp.prepare(self.request)
        if self.chat:
            await self.resp.write(self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                "logprobs": None, "finish_reason": None}]))

    async def token(self, text: str, token: int | None, finish: str | None) -> None:
        if self.chat:
            choice = {"index": 0, "delta": {"content": text} if text else {}, "logprobs": None,
                      "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                      "token_ids": [] if token is None else [token]}
        await self.resp.write(self._chunk([choice]))

    async def error(self, message: str) -> None:
        await self.resp.write(b"data: " + _dumps({"error": {"message": message, "type": "server_error"}}) + b"\n\n")
        await self.resp.write(b"data: [DONE]\n\n")

    async def close(self, usage: dict) -> None:
        if self.include_usage:
            await self.resp.write(self._chunk([], usage=usage))
        await self.resp.write(b"data: [DONE]\n\n")
        await self.resp.write_eof()


async def serve(engine: LLMEngine, tokenizer: Tokenizer | None, *, host: str, port: int, served_name: str,
                api_key: str | None = None, root: str | None = None, ready_message: bool = True,
                limits: ServerLimits | None = None, on_ready: Callable[[], object] | None = None,
                stalls: Stalls | None = None) -> None:
    """Serve until cancelled; raise EngineFailed when the engine cannot go on (so the process exits
    instead of answering 503 for ever). ``on_ready`` runs once the engine has warmed up, before the port
    opens (the CLI freezes the start-up heap there); ``stalls`` (server_process.Stalls) adds the
    collector's pauses and Triton's compiles to /metrics."""
    srv = OpenAIServer(engine, tokenizer, served_name, api_key, root, limits, stalls)
    runner = web.AppRunner(srv.app(), handler_cancellation=True, access_log=None, shutdown_timeout=2.0,
                           keepalive_timeout=srv.limits.request_timeout)
    await runner.setup()
    loop = asyncio.get_running_loop()
    failed: asyncio.Future[str] = loop.create_future()
    srv.on_fatal = lambda msg: failed.done() or failed.set_result(msg)
    srv.guard = ConnectionGuard(runner.server, srv.limits)
    if on_ready is not None:
        on_ready()
    server = await loop.create_server(srv.guard, host, port, reuse_address=True, backlog=128)
    if ready_message:
        print(f"k2bench serve: {served_name} ready on http://{host}:{port}/v1", flush=True)
    try:
        message = await failed
    finally:
        server.close()
        await runner.cleanup()
    raise EngineFailed(message)
