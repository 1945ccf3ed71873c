"""Minimal OpenAI-compatible completion servers with known answers, for testing `k2bench eval`."""

from __future__ import annotations

import json
import random
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class AnswerServer:
    """Answers each /v1/completions prompt with `answer(prompt)`, non-streaming, on a free port.

    Like an OpenAI server it cuts each answer before the first of the request's `stop` strings.
    """

    def __init__(self, answer: Callable[[str], str], model: str = "fake") -> None:
        outer = self
        self.prompts: list[str] = []
        self.stops: list[list[str]] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def _send(self, doc: dict) -> None:
                body = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._send({"object": "list", "data": [{"id": model, "object": "model"}]})

            def do_POST(self) -> None:
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompts = req["prompt"] if isinstance(req["prompt"], list) else [req["prompt"]]
                stop = req.get("stop") or []
                stop = [stop] if isinstance(stop, str) else stop
                outer.prompts.extend(prompts)
                outer.stops.append(stop)
                self._send({"object": "text_completion", "model": model,
                            "choices": [{"index": i, "text": _cut(answer(p), stop), "finish_reason": "stop"}
                                        for i, p in enumerate(prompts)]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _cut(text: str, stops: list[str]) -> str:
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=len(text))
    return text[:cut]


def random_digits(seed: int = 0) -> Callable[[str], str]:
    """A server that returns random tokens: 1-3 random digits, whatever was asked."""
    rng = random.Random(seed)
    lock = threading.Lock()

    def answer(prompt: str) -> str:
        with lock:
            return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 3))) + "\n"

    return answer


def adder(prompt: str) -> str:
    """The right answer to a tiny-arith prompt ("07+85=" -> "092"), computed independently of the data files."""
    a, b = re.fullmatch(r"(\d+)\+(\d+)=", prompt).groups()
    return f"{int(a) + int(b):03d}\nmore text the stop string cuts"
