"""OpenAI-compatible HTTP server (aiohttp) in front of the engine thread.

Each request becomes one Sequence; its tokens arrive on an asyncio.Queue, one event per
engine step, and are sent as one SSE message each (so client-side ITL is the step time). A
request whose client goes away is aborted, which frees its KV blocks at the engine's next step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid

from aiohttp import web

from k2bench.engine.runtime import server_metrics
from k2bench.engine.runtime.engine import AsyncEngine, LLMEngine
from k2bench.engine.runtime.protocol import (
    RequestError,
    StopStrings,
    parse_common,
    parse_messages,
    parse_prompt,
)
from k2bench.engine.runtime.sequence import Sequence
from k2bench.engine.runtime.tokenizer import Detokenizer, Tokenizer, TokenizerError

log = logging.getLogger(__name__)

try:
    import orjson

    def _dumps(obj) -> bytes:
        return orjson.dumps(obj)
except ImportError:  # pragma: no cover
    def _dumps(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


def error_response(message: str, status: int = 400, param: str | None = None, code: str | None = None,
                   etype: str = "invalid_request_error") -> web.Response:
    body = {"error": {"message": message, "type": etype, "param": param, "code": code}}
    return web.Response(body=_dumps(body), status=status, content_type="application/json")


class OpenAIServer:
    def __init__(self, engine: LLMEngine, tokenizer: Tokenizer | None, served_name: str,
                 api_key: str | None = None, root: str | None = None):
        self.engine = engine
        self.tok = tokenizer
        self.names = (served_name,)
        self.root = root  # the model folder, listed as "root" (as vLLM does) so clients find its tokenizer
        self.api_key = api_key
        self.async_engine: AsyncEngine | None = None
        self.prom = server_metrics.ServerMetrics(engine)
        self.created = int(time.time())
        self.vocab_size = getattr(engine, "model_config", None) and engine.model_config.vocab_size or (
            tokenizer.vocab_size if tokenizer else 1 << 31)

    # ---- app ---------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=64 << 20)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app) -> None:
        self.async_engine = AsyncEngine(self.engine, asyncio.get_running_loop())
        self.async_engine.start()
        # the port opens (and the server says it is ready) once the engine thread has warmed up
        await asyncio.get_running_loop().run_in_executor(None, self.async_engine.warmed.wait)

    async def _stop(self, app) -> None:
        if self.async_engine is not None:
            self.async_engine.stop()

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        if self.api_key and request.path not in ("/health",):
            if request.headers.get("Authorization", "") != f"Bearer {self.api_key}":
                return error_response("invalid or missing API key", 401, code="invalid_api_key",
                                      etype="authentication_error")
        try:
            return await handler(request)
        except RequestError as exc:
            return error_response(str(exc), exc.status, exc.param, exc.code)
        except TokenizerError as exc:
            return error_response(str(exc), 400)
        except web.HTTPException:
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:  # the server must survive anything a request does
            log.exception("request failed")
            return error_response(f"internal error: {exc}", 500, etype="server_error")

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
            ids = self._encode_chat(parse_messages(body))
        else:
            ids = parse_prompt(body, self.vocab_size)
            ids = self._encode(ids, _special(body)) if isinstance(ids, str) else ids
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": self.engine.config.max_model_len})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        ids = parse_prompt({"prompt": body.get("tokens")}, self.vocab_size)
        if isinstance(ids, str):
            raise RequestError("'tokens' must be a list of token ids", "tokens")
        return web.json_response({"prompt": self._need_tok().decode(ids, skip_special=False)})

    # ---- generation ---------------------------------------------------------------------------
    async def _json(self, request: web.Request) -> dict:
        try:
            body = await request.json(loads=json.loads)
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
            raise RequestError("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        return body

    def _need_tok(self) -> Tokenizer:
        if self.tok is None:
            raise RequestError("this model has no tokenizer: send token-id prompts")
        return self.tok

    def _encode(self, text: str, add_special: bool = True) -> list[int]:
        return self._need_tok().encode(text, add_special)

    def _encode_chat(self, messages: list[dict]) -> list[int]:
        tok = self._need_tok()
        return tok.encode(tok.apply_chat_template(messages), add_special=False)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        req = parse_common(body, self.names, default_max_tokens=16)
        prompt = parse_prompt(body, self.vocab_size)
        ids = self._encode(prompt, _special(body)) if isinstance(prompt, str) else prompt
        return await self._generate(request, ids, req, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        req = parse_common(body, self.names, default_max_tokens=None)
        ids = self._encode_chat(parse_messages(body))
        return await self._generate(request, ids, req, chat=True)

    async def _generate(self, request: web.Request, ids: list[int], req, chat: bool) -> web.StreamResponse:
        if req.max_tokens is None:
            req.params.max_tokens = max(1, self.engine.config.max_model_len - len(ids))
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
                        return error_response(ev.error, 400 if not self.async_engine.fatal else 500)
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
                     "total_tokens": len(ids) + seq.num_output_tokens}
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
                api_key: str | None = None, root: str | None = None, ready_message: bool = True) -> None:
    srv = OpenAIServer(engine, tokenizer, served_name, api_key, root)
    runner = web.AppRunner(srv.app(), handler_cancellation=True, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    if ready_message:
        print(f"k2bench serve: {served_name} ready on http://{host}:{port}/v1", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
