"""--profile-level C[:N]: the server's profiler around N requests at concurrency C, kept with the run.

The profiled requests are an extra pass, sent after level C's measured requests are summarised and
stored (same concurrency, fresh prompts, no warmup: the level just warmed the server). A profiler
slows what it watches, so none of its requests enter any level's figures; the run keeps the pass
apart, in its ``profile`` field: the concurrency, the requests sent and completed, and what the
server's /stop_profile answered.

The endpoints are vLLM's and SGLang's: POST /start_profile, then POST /stop_profile. The request
body names ``output_dir`` (SGLang's field; vLLM ignores it and writes under VLLM_TORCH_PROFILER_DIR,
and answers 404 when that is unset). The bundled engine answers /stop_profile with its trace path and
a kernel-time summary (``k2bench.profile/1``: per op or kernel, calls, self and total µs, self µs per
engine step); other servers' answers carry no summary, so their runs keep where the trace went but
`k2bench profile-diff` has nothing to compare. A server without a profiler does not stop the sweep:
the run records why there is no profile.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from k2bench.errors import UserError

SUMMARY_FORMAT = "k2bench.profile/1"
NOTE = "an extra pass after the level's measured requests; not in any level's figures"


@dataclass(frozen=True)
class ProfileLevel:
    concurrency: int
    requests: int | None  # None: as many as the concurrency (one full batch)

    def requests_for(self) -> int:
        return self.requests if self.requests is not None else self.concurrency


def parse(text: str, name: str = "--profile-level") -> ProfileLevel:
    """'4' -> ProfileLevel(4, None); '4:8' -> ProfileLevel(4, 8); else UserError."""
    m = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", str(text))
    if not m:
        raise UserError(f"{name} {text!r}: expected C or C:N (profile N requests at concurrency C), e.g. 4:8")
    conc, n = int(m.group(1)), int(m.group(2)) if m.group(2) else None
    if conc < 1 or (n is not None and n < 1):
        raise UserError(f"{name} {text!r}: the concurrency and the request count must be at least 1")
    return ProfileLevel(conc, n)


class ProfilerUnavailable(Exception):
    """The server did not start or stop its profiler (the reason is kept with the run)."""


def _post(base_url: str, path: str, body: dict | None, api_key: str | None, timeout_s: float) -> bytes:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(base_url.rstrip("/") + path, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", errors="replace")[:300].strip()
        hint = " (vLLM serves it only with VLLM_TORCH_PROFILER_DIR set)" if exc.code == 404 else ""
        raise ProfilerUnavailable(f"POST {path} answered HTTP {exc.code}{hint}" +
                                  (f": {detail}" if detail else "")) from None
    except (urllib.error.URLError, OSError) as exc:
        raise ProfilerUnavailable(f"POST {path}: {getattr(exc, 'reason', exc)}") from None


def start(base_url: str, output_dir: str, api_key: str | None = None, timeout_s: float = 60.0) -> None:
    _post(base_url, "/start_profile", {"output_dir": output_dir}, api_key, timeout_s)


def stop(base_url: str, api_key: str | None = None, timeout_s: float = 600.0) -> dict:
    """What the server answered: the bundled engine's trace and summary, else its text (if any)."""
    raw = _post(base_url, "/stop_profile", None, api_key, timeout_s)
    try:
        answer = json.loads(raw) if raw.strip() else {}
    except ValueError:
        answer = {"answer": raw.decode("utf-8", errors="replace")[:300]}
    if not isinstance(answer, dict):
        answer = {"answer": answer}
    summary = answer.get("summary")
    return {"trace": answer.get("trace"), "summary_path": answer.get("summary_path"),
            "summary": summary if is_summary(summary) else None,
            **({"answer": answer["answer"]} if "answer" in answer else {})}


def is_summary(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("format") == SUMMARY_FORMAT and isinstance(obj.get("ops"), list)
