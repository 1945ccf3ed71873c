"""vLLM's `vllm bench serve --save-result` JSON: one concurrency level per file.

Fields as vLLM writes them (vllm/benchmarks/serve.py): ``max_concurrency``, ``num_prompts``,
``completed``, ``failed``, ``duration`` (s), ``total_input_tokens``, ``total_output_tokens``,
``total_token_throughput`` and ``output_throughput`` (tok/s), and for each of ttft/tpot/itl/e2el
that ``--percentile-metrics`` selected: ``mean_X_ms``, ``median_X_ms``, ``std_X_ms`` and one
``pP_X_ms`` per ``--metric-percentiles`` value. ``date`` is the benchmark machine's local time
(%Y%m%d-%H%M%S, no zone), stored as given. ``--metadata tp=N`` (vLLM's own key=value metadata)
gives the GPU count when ``--gpus`` is not given.

Speculative decoding, when the server speculated (vLLM scrapes its spec_decode counters around the
benchmark): ``spec_decode_num_drafts``, ``spec_decode_draft_tokens``, ``spec_decode_accepted_tokens``,
``spec_decode_acceptance_length`` (1 + accepted / drafts) and ``spec_decode_acceptance_rate`` (a
percentage of the draft tokens). The counts are used where present (the two figures follow from them
exactly); the file's own figures otherwise.

With ``--save-detailed`` the file also holds one entry per request: ``ttfts`` (s), ``itls`` (s, the
gaps between content chunks), ``input_lens``, ``output_lens``, ``errors`` (empty when it succeeded)
and, in newer versions, ``latencies`` (s) and ``start_times`` (s). These become the level's stored
requests, stamped from a send at 0 (or the start time): first chunk at ttft, each later chunk an itl
after the one before, the last at the latency where the file has it. So SLO attainment and goodput
can be computed after the import by vLLM's own rule (k2bench.harness.measure.slo). vLLM does not keep
the output length a request asked for: its output length stands in for it.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

from k2bench.errors import UserError
from k2bench.harness.importers import (
    ImportOptions,
    Level,
    base_run,
    count,
    gpus_or_error,
    interactivity,
    number,
    per_gpu,
    read_json,
)

# k2bench stat -> vLLM key prefix
STATS = {"mean": "mean", "median": "median", "std": "std", "p90": "p90", "p99": "p99", "p99.9": "p99.9"}
METRICS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "itl_ms": "itl", "e2el_ms": "e2el"}


def _date(doc: dict, path: Path) -> str:
    text = doc.get("date")
    try:
        return datetime.strptime(str(text), "%Y%m%d-%H%M%S").isoformat()
    except ValueError:
        raise UserError(f"{path}: date {text!r} is not vLLM's %Y%m%d-%H%M%S") from None


def _gpus_from_metadata(doc: dict, path: Path) -> int | None:
    for key in ("tp", "tensor_parallel_size", "num_gpus"):
        if key in doc:
            try:
                return int(str(doc[key]))
            except ValueError:
                raise UserError(f"{path}: metadata {key}={doc[key]!r} is not a number") from None
    return None


def speculation(doc: dict, path: Path) -> tuple[float | None, float | None]:
    """(acceptance length, draft acceptance rate as a fraction) of a result file; (None, None) without
    speculation."""
    drafts = count(doc.get("spec_decode_num_drafts"), "spec_decode_num_drafts", path)
    drafted = count(doc.get("spec_decode_draft_tokens"), "spec_decode_draft_tokens", path)
    accepted = count(doc.get("spec_decode_accepted_tokens"), "spec_decode_accepted_tokens", path)
    length = number(doc, "spec_decode_acceptance_length", path)
    percent = number(doc, "spec_decode_acceptance_rate", path)
    if drafts and accepted is not None:
        length = 1.0 + accepted / drafts
    if drafted and accepted is not None:
        if accepted > drafted:
            raise UserError(f"{path}: spec_decode_accepted_tokens ({accepted}) is more than "
                            f"spec_decode_draft_tokens ({drafted})")
        percent = 100.0 * accepted / drafted
    if percent is not None and not 0 <= percent <= 100:
        raise UserError(f"{path}: spec_decode_acceptance_rate is {percent:g}; vLLM writes a percentage (0..100)")
    if length is not None and length < 1:
        raise UserError(f"{path}: spec_decode_acceptance_length is {length:g}; a step yields at least one token")
    return length, None if percent is None else percent / 100.0


def read(path: Path, opts: ImportOptions) -> Level:
    doc = read_json(path)
    if "max_concurrency" not in doc or "completed" not in doc:
        raise UserError(f"{path}: not a `vllm bench serve --save-result` file (no max_concurrency/completed)")
    conc = doc.get("max_concurrency")
    if not isinstance(conc, int) or isinstance(conc, bool) or conc < 1:
        raise UserError(f"{path}: max_concurrency is {conc!r}; k2bench stores closed-loop levels, so the "
                        "benchmark must have run with --max-concurrency")
    gpus = gpus_or_error(_gpus_from_metadata(doc, path), opts, path)
    completed = count(doc.get("completed"), "completed", path)
    if completed is None:
        raise UserError(f"{path}: completed is missing")
    num_prompts = count(doc.get("num_prompts"), "num_prompts", path)
    failed = count(doc.get("failed"), "failed", path)
    if failed is None:  # older vLLM: every prompt was sent, so the rest failed
        if num_prompts is None:
            raise UserError(f"{path}: neither failed nor num_prompts is given")
        if num_prompts < completed:
            raise UserError(f"{path}: completed ({completed}) is more than num_prompts ({num_prompts})")
        failed = num_prompts - completed
    total = number(doc, "total_token_throughput", path)
    output = number(doc, "output_throughput", path)
    latency = {metric: {stat: number(doc, f"{prefix}_{key}_ms", path) for stat, prefix in STATS.items()}
               for metric, key in METRICS.items()}
    accept_len, accept_rate = speculation(doc, path)
    point = {
        "concurrency": conc, "num_prompts": completed + failed, "completed": completed,
        "failed": failed, "duration_s": number(doc, "duration", path),
        "input_tokens": count(doc.get("total_input_tokens"), "total_input_tokens", path),
        "output_tokens": count(doc.get("total_output_tokens"), "total_output_tokens", path),
        "tput_per_gpu": per_gpu(total, gpus), "output_tput_per_gpu": per_gpu(output, gpus),
        "input_tput_per_gpu": per_gpu(None if total is None or output is None else total - output, gpus),
        "interactivity": interactivity(latency["tpot_ms"]), **latency,
        "spec_accept_len": accept_len, "spec_accept_rate": accept_rate,
        "extra": {"request_throughput": number(doc, "request_throughput", path),
                  "std_is_population": True},
    }
    run = base_run(opts, engine=None, model=str(doc.get("model_id") or "unknown"), num_gpus=gpus,
                   started_at=_date(doc, path), tp=_gpus_from_metadata(doc, path),
                   extra={"vllm_backend": doc.get("backend") or doc.get("endpoint_type"),
                          "vllm_label": doc.get("label"), "request_rate": doc.get("request_rate")})
    requests = _requests(doc, conc, path)
    if "request_goodput" in doc:
        point["extra"]["request_goodput"] = number(doc, "request_goodput", path)
    return Level(run=run, point=point, source=str(path), requests=requests)


def _per_request(doc: dict, key: str, n: int, path: Path) -> list | None:
    values = doc.get(key)
    if values is None or (isinstance(values, list) and not values):
        return None
    if not isinstance(values, list) or len(values) != n:
        raise UserError(f"{path}: {key} must be a list of {n} entries (one per request, as ttfts), "
                        f"not {values!r:.80}")
    return values


def _seconds(value, key: str, path: Path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise UserError(f"{path}: {key} must hold finite numbers of seconds >= 0, not {value!r:.80}")
    return float(value)


def _requests(doc: dict, conc: int, path: Path) -> list[dict]:
    """The per-request entries of a --save-detailed file as k2bench.run requests ([] when it has none)."""
    ttfts = doc.get("ttfts")
    if not ttfts:
        return []
    if not isinstance(ttfts, list):
        raise UserError(f"{path}: ttfts must be a list")
    n = len(ttfts)
    itls = _per_request(doc, "itls", n, path)
    outs = _per_request(doc, "output_lens", n, path)
    if itls is None or outs is None:
        raise UserError(f"{path}: ttfts without itls and output_lens: the per-request data is incomplete")
    ins = _per_request(doc, "input_lens", n, path)
    errors = _per_request(doc, "errors", n, path)
    latencies = _per_request(doc, "latencies", n, path)
    starts = _per_request(doc, "start_times", n, path)
    out = []
    for i in range(n):
        error = str(errors[i]) if errors and errors[i] else None
        output_len = count(outs[i], f"output_lens[{i}]", path)
        success = error is None and output_len is not None and output_len > 0
        send_ns = round(_seconds(starts[i], f"start_times[{i}]", path) * 1e9) if starts else 0
        stamps_s: list[float] = []
        if success:
            gaps = itls[i] if isinstance(itls[i], list) else None
            if gaps is None:
                raise UserError(f"{path}: itls[{i}] must be a list of seconds")
            t = _seconds(ttfts[i], f"ttfts[{i}]", path)
            stamps_s = [t]
            for gap in gaps:
                t += _seconds(gap, f"itls[{i}]", path)
                stamps_s.append(t)
            if latencies:  # vLLM's own latency: the last chunk, without the rounding of a sum of gaps
                stamps_s[-1] = _seconds(latencies[i], f"latencies[{i}]", path)
        token_ns = [round(s * 1e9) for s in stamps_s]
        deltas = [b - a for a, b in zip([0, *token_ns], token_ns, strict=False)]
        input_len = count(ins[i], f"input_lens[{i}]", path) if ins else None
        out.append({"concurrency": conc, "index": i, "warmup": False,
                    "requested_input_tokens": input_len or 0, "requested_output_tokens": output_len or 0,
                    "send_ns": send_ns, "end_ns": send_ns + token_ns[-1] if token_ns else None,
                    "token_delta_ns": deltas, "prompt_tokens": input_len,
                    "output_tokens": output_len if success else None, "success": success,
                    "error": error or (None if success else "no output")})
    return out
