"""Greedy tokens of `k2bench serve` at several tensor-parallel sizes, compared over HTTP.

Starts the server once per TP size (or per `--variant`: a TP size with its own extra server
arguments) on the same checkpoint, sends the same token-id prompts (temperature 0, ignore_eos), reads
the streamed token ids, stops the server, and compares every run against the first. Prints a table
and writes JSON.

    python bench/tp_greedy_check.py --model DIR --tp 1 4 --server-args "--device cuda --dtype float32" --out x.json
    python bench/tp_greedy_check.py --model DIR --server-args "--device cuda" \
        --variant 1 "2:--all-reduce nccl" "2:--all-reduce one-shot" --out x.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from k2bench.net import free_port


def wait_ready(url: str, proc: subprocess.Popen, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; see its log")
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"server not ready after {deadline_s:.0f} s")


def greedy(url: str, prompt: list[int], max_tokens: int) -> list[int]:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    ids: list[int] = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                msg = json.loads(line[6:])
                if msg.get("choices"):
                    ids.extend(msg["choices"][0].get("token_ids") or [])
    return ids


def parse_variant(text: str) -> tuple[int, str]:
    """'2:--all-reduce nccl' -> (2, '--all-reduce nccl'); '1' -> (1, '')."""
    tp, _, extra = text.partition(":")
    try:
        return int(tp), extra.strip()
    except ValueError:
        raise argparse.ArgumentTypeError(f"a variant is TP[:server args], e.g. '2:--all-reduce nccl' (got {text!r})") from None


def run_tp(model: str, tp: int, server_args: str, prompts: list[list[int]], max_tokens: int, log: Path) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "k2bench.harness.cli", "serve", "--model", model, "--tp", str(tp), "--port",
           str(port), *shlex.split(server_args)]
    t0 = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc, 900)
        load_s = time.monotonic() - t0
        t1 = time.monotonic()
        tokens = [greedy(url, p, max_tokens) for p in prompts]
        return {"tp": tp, "load_s": round(load_s, 1), "generate_s": round(time.monotonic() - t1, 2), "tokens": tokens}
    except Exception:
        print(log.read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def prefix_match(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--server-args", default="", help="arguments every server gets")
    ap.add_argument("--variant", type=parse_variant, nargs="+", default=None,
                    help="runs as TP[:extra server args], compared with the first (instead of --tp)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[7, 100, 1000, 4000])
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--out", type=Path, default=Path("tp_greedy.json"))
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    rng = random.Random(1234)
    prompts = [[rng.randrange(16, vocab) for _ in range(n)] for n in args.lengths]
    runs = args.variant or [(tp, "") for tp in args.tp]
    results = []
    for i, (tp, extra) in enumerate(runs):
        log = args.out.with_name(f"serve_tp{tp}.log" if args.variant is None else f"serve_{i}_tp{tp}.log")
        r = run_tp(args.model, tp, f"{args.server_args} {extra}".strip(), prompts, args.max_tokens, log)
        r["extra_args"] = extra
        r["all_reduce_log"] = [ln for ln in log.read_text().splitlines() if "all-reduce:" in ln]
        results.append(r)
    ref = results[0]
    print(f"{'tp':>3} {'load s':>7} {'gen s':>7}  tokens equal to the first run (per prompt, of {args.max_tokens})")
    for r in results:
        r["prefix_match"] = [prefix_match(a, b) for a, b in zip(ref["tokens"], r["tokens"], strict=True)]
        r["identical"] = r["tokens"] == ref["tokens"]
        print(f"{r['tp']:>3} {r['load_s']:>7} {r['generate_s']:>7}  {r['prefix_match']}  identical={r['identical']}"
              f"  {r['extra_args']}")
        for line in r["all_reduce_log"]:
            print(f"      {line.strip()}")
    args.out.write_text(json.dumps({"model": args.model, "server_args": args.server_args, "lengths": args.lengths,
                                    "results": results}, indent=2))
    return 0 if all(r["identical"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
