"""``loadgen_bench.py --mode transport``: client CPU per streamed token of the raw transport, aiohttp's path
and (with ``--reference-client``) InferenceX's client, in interleaved rounds against the test server.

Each round runs every client once, in turn, each against a fresh test server pinned to its own core
(the client on another): concurrency 64, a 2 ms gap, 1,024 output tokens (about 32k tokens/s asked for),
TTFT 200 ms. k2bench's two transports run in this process (``K2BENCH_TRANSPORT`` switched between them)
with one warmup wave and two measured waves; InferenceX's client runs in a child process
(bench/reference_client.py) over the same number of requests, with no warmup (it opens a new connection
for every request, so a warmup would not warm anything). CPU is user + system time over the whole level
divided by the token messages streamed; tokens/s carried and the TTFT and TPOT errors are read against the
server's own record of the measured requests (``/stats?from=N``), as the accuracy mode does. Interleaving
spreads the shared machine's slow moments over all clients instead of one.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from k2bench.harness.load import transport
from k2bench.harness.load.loadgen import LevelSpec, run, run_level
from k2bench.harness.load.transport import TRANSPORT_ENV
from k2bench.net import free_port
from k2bench.workloads.prompts import Prompt

CONC, TTFT_MS, ITL_MS, OSL, ISL, WAVES = 64, 200.0, 2.0, 1024, 128, 2
CLIENTS = ("raw", "aiohttp")


def _stats(port: int, first: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats?from={first}", timeout=10) as resp:
        return json.loads(resp.read())["actual"]


def _user_s() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def _row(client: str, cpu_s: float, user_s: float, tokens: int, failed: int, ttft_ms: float, tpot_ms: float,
         actual: dict) -> dict:
    return {"client": client, "failed": failed, "token_messages": tokens, "client_cpu_s": round(cpu_s, 3),
            "client_cpu_us_per_token": round(cpu_s / tokens * 1e6, 2),
            "client_user_us_per_token": round(user_s / tokens * 1e6, 2),
            "tok_s_carried": round(actual["output_tokens"] / actual["span_s"]),
            "ttft_median_error_vs_server_ms": round(ttft_ms - actual["ttft_p50_ms"], 2),
            "tpot_median_error_vs_server_pct": round((tpot_ms - actual["tpot_p50_ms"]) / actual["tpot_p50_ms"] * 100, 3)}


def run_k2bench(kind: str, port: int, cpu_s) -> dict:
    os.environ[TRANSPORT_ENV] = kind
    prompts = [Prompt(input_len=ISL, output_len=OSL, token_ids=[(7 * i + j) % 30000 for j in range(ISL)])
               for i in range(CONC)]
    spec = LevelSpec(base_url=f"http://127.0.0.1:{port}", model="k2bench-test", concurrency=CONC,
                     num_prompts=WAVES * CONC, num_warmup=CONC, timeout_s=600)
    cpu0, user0 = cpu_s(), _user_s()
    records = run(run_level(spec, prompts))
    cpu, user = cpu_s() - cpu0, _user_s() - user0
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.success]
    ttft = statistics.median((r.token_ns[0] - r.send_ns) / 1e6 for r in ok)
    tpot = statistics.median((r.token_ns[-1] - r.token_ns[0]) / 1e6 / (len(r.token_ns) - 1) for r in ok)
    return _row(kind, cpu, user, sum(len(r.token_ns) for r in records), len(measured) - len(ok), ttft, tpot,
                _stats(port, CONC + 1))


def run_reference(path: str, port: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="k2ref") as tmp:
        out = Path(tmp) / "ref.json"
        cmd = [sys.executable, str(Path(__file__).with_name("reference_client.py")), "--client", path,
               "--url", f"http://127.0.0.1:{port}", "--concurrency", str(CONC),
               "--num-prompts", str((WAVES + 1) * CONC), "--isl", str(ISL), "--osl", str(OSL), "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"InferenceX's client failed (exit {proc.returncode}): {proc.stderr[-800:]}")
        ref = json.loads(out.read_text())
    return _row("InferenceX", ref["client_cpu_s"], ref["client_user_s"], ref["token_messages"], ref["failed"], ref["ttft_ms_median"],
                ref["tpot_ms_median"], _stats(port, 1))


def run_transport(repeats: int, reference: str | None, server_core: int | None, start_server, cpu_s) -> dict:
    if transport.httptools is None:  # the "raw" rows would quietly be aiohttp's
        raise SystemExit("httptools is not installed, so the raw transport cannot run: pip install httptools")
    clients = CLIENTS + (("InferenceX",) if reference else ())
    rounds = []
    for i in range(repeats):
        for client in clients:
            port = free_port()
            server = start_server(port, TTFT_MS, ITL_MS, server_core)
            try:
                row = run_reference(reference, port) if client == "InferenceX" else run_k2bench(client, port, cpu_s)
            finally:
                server.kill()
                server.wait()
            row["round"] = i
            rounds.append(row)
            print(json.dumps(row), file=sys.stderr)
            time.sleep(0.5)  # let the killed server's core settle before the next client
    os.environ.pop(TRANSPORT_ENV, None)
    summary = []
    for client in clients:
        mine = [r for r in rounds if r["client"] == client]
        us = [r["client_cpu_us_per_token"] for r in mine]
        summary.append({"client": client, "rounds": len(mine), "cpu_us_per_token_median": statistics.median(us),
                        "cpu_us_per_token_min": min(us), "cpu_us_per_token_max": max(us),
                        "user_us_per_token_median": statistics.median(r["client_user_us_per_token"] for r in mine),
                        "tok_s_carried_median": statistics.median(r["tok_s_carried"] for r in mine),
                        "ttft_error_vs_server_ms_median":
                            statistics.median(r["ttft_median_error_vs_server_ms"] for r in mine),
                        "tpot_error_vs_server_pct_median":
                            statistics.median(r["tpot_median_error_vs_server_pct"] for r in mine),
                        "failed": sum(r["failed"] for r in mine)})
    return {"concurrency": CONC, "ttft_ms": TTFT_MS, "itl_ms": ITL_MS, "osl": OSL, "isl": ISL,
            "asked_tok_s": round(CONC / (ITL_MS / 1e3)), "reference_client": reference, "rounds": rounds,
            "summary": summary}


def table(res: dict) -> list[tuple]:
    return [(s["client"], f"{s['cpu_us_per_token_median']:.2f}",
             f"{s['cpu_us_per_token_min']:.2f}-{s['cpu_us_per_token_max']:.2f}",
             f"{s['user_us_per_token_median']:.2f}", f"{s['tok_s_carried_median']:.0f}",
             f"{s['ttft_error_vs_server_ms_median']:+.2f}", f"{s['tpot_error_vs_server_pct_median']:+.3f}",
             s["failed"]) for s in res["summary"]]


HEADER = ("client", "CPU us/token (median)", "range over rounds", "of it user", "tok/s carried", "TTFT p50 err vs server ms",
          "TPOT p50 err vs server %", "failed")
