"""How much the load generator itself costs and distorts, measured against the test server.

The test server runs in its own process pinned to one core and the client (this process) on
another, as in the InferenceX client measurement the issue quotes. For each case we know the
truth (TTFT and per-token gap are the server's settings), so the table shows:

- client CPU microseconds per streamed token (user + system CPU time of this process over the
  level, warmup included, divided by all tokens streamed),
- median and p99 TTFT error against the configured TTFT,
- median TPOT error against the configured gap, in percent,
- output tokens per second achieved against the rate asked for (concurrency / gap),
- the same errors against what the server actually did (its own per-request record from
  ``/stats?from=N``): the nominal errors include the server's own lateness on a busy machine,
  these isolate the load generator's.

    python bench/loadgen_bench.py                 # table + results/bench/loadgen_bench.json
    python bench/loadgen_bench.py --quick --out /tmp/lg.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from k2bench.harness.load.loadgen import LevelSpec, event_loop_name, run, run_level
from k2bench.net import free_port
from k2bench.workloads.prompts import Prompt

# (concurrency, ttft ms, gap ms, output tokens per request)
CASES = [(64, 200.0, 20.0, 256), (128, 200.0, 20.0, 256), (64, 200.0, 2.0, 1024), (128, 200.0, 2.0, 1024)]
QUICK = [(64, 200.0, 20.0, 64), (128, 200.0, 20.0, 64), (64, 200.0, 2.0, 256)]


def _start_server(port: int, ttft_ms: float, itl_ms: float, core: int | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "k2bench.harness.load.testserver", "--port", str(port),
           "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)]
    if core is not None:
        cmd += ["--cpu", str(core)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"test server exited: {proc.stderr.read().decode()[-500:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("test server did not become ready")


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_case(conc: int, ttft_ms: float, itl_ms: float, osl: int, waves: int, core: int | None) -> dict:
    port = free_port()
    server = _start_server(port, ttft_ms, itl_ms, core)
    try:
        prompts = [Prompt(input_len=128, output_len=osl, token_ids=[(7 * i + j) % 30000 for j in range(128)])
                   for i in range(conc)]
        spec = LevelSpec(base_url=f"http://127.0.0.1:{port}", model="k2bench-test", concurrency=conc,
                         num_prompts=waves * conc, num_warmup=conc, timeout_s=600)
        cpu0, wall0 = _cpu_s(), time.perf_counter()
        records = run(run_level(spec, prompts))
        cpu, wall = _cpu_s() - cpu0, time.perf_counter() - wall0
        # the server numbers requests from 1 in arrival order; the first `conc` were the warmup
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats?from={conc + 1}", timeout=5) as resp:
            stats = json.loads(resp.read())
        actual = stats["actual"]
        server_cpu = _proc_cpu_s(server.pid)
    finally:
        server.kill()
        server.wait()
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.success]
    if len(ok) != len(measured):
        raise RuntimeError(f"{len(measured) - len(ok)} requests failed: {next(r.error for r in measured if not r.success)}")
    ttft = sorted((r.token_ns[0] - r.send_ns) / 1e6 for r in ok)
    tpot = [(r.token_ns[-1] - r.token_ns[0]) / 1e6 / (r.output_tokens - 1) for r in ok]
    tokens = sum(len(r.token_ns) for r in records)
    start = min(r.send_ns for r in measured)
    end = max(r.end_ns for r in measured)
    out_tput = sum(r.output_tokens for r in ok) / ((end - start) / 1e9)
    return {
        "concurrency": conc, "ttft_ms_truth": ttft_ms, "itl_ms_truth": itl_ms, "osl": osl,
        "requests": len(records), "tokens_streamed": tokens, "wall_s": round(wall, 2),
        "client_cpu_s": round(cpu, 3), "client_cpu_us_per_token": round(cpu / tokens * 1e6, 2),
        "ttft_median_error_ms": round(statistics.median(ttft) - ttft_ms, 2),
        "ttft_p99_error_ms": round(ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))] - ttft_ms, 2),
        "tpot_median_error_pct": round((statistics.median(tpot) - itl_ms) / itl_ms * 100, 3),
        "analytic_tok_s": round(conc * osl / ((ttft_ms + (osl - 1) * itl_ms) / 1e3)), "output_tok_s": round(out_tput),
        "server_cpu_s": round(server_cpu, 2), "server_late_p50_ms": stats.get("late_p50_ms"),
        "server_late_p99_ms": stats.get("late_p99_ms"),
        "server_ttft_p50_ms": actual["ttft_p50_ms"], "server_tpot_p50_ms": actual["tpot_p50_ms"],
        "ttft_median_error_vs_server_ms": round(statistics.median(ttft) - actual["ttft_p50_ms"], 2),
        "tpot_median_error_vs_server_pct": round((statistics.median(tpot) - actual["tpot_p50_ms"])
                                                 / actual["tpot_p50_ms"] * 100, 3),
        "server_tok_s": round(actual["output_tokens"] / actual["span_s"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/bench/loadgen_bench.json")
    ap.add_argument("--quick", action="store_true", help="shorter streams, for a smoke run")
    ap.add_argument("--waves", type=int, default=2, help="measured requests = waves x concurrency")
    ap.add_argument("--no-pin", action="store_true", help="do not pin server and client to cores")
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    pin = not args.no_pin and len(cores) >= 2
    if pin:
        os.sched_setaffinity(0, {cores[1]})
    rows = []
    for conc, ttft, itl, osl in (QUICK if args.quick else CASES):
        row = run_case(conc, ttft, itl, osl, args.waves, cores[0] if pin else None)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    header = ("conc", "gap ms", "analytic tok/s", "got tok/s", "client CPU us/token",
              "TTFT p50 err ms", "TTFT p99 err ms", "TPOT p50 err %", "server tok/s",
              "TTFT p50 err vs server ms", "TPOT p50 err vs server %")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        lines.append(f"| {r['concurrency']} | {r['itl_ms_truth']:g} | {r['analytic_tok_s']} | {r['output_tok_s']} | "
                     f"{r['client_cpu_us_per_token']:.1f} | {r['ttft_median_error_ms']:+.1f} | "
                     f"{r['ttft_p99_error_ms']:+.1f} | {r['tpot_median_error_pct']:+.2f} | {r['server_tok_s']} | "
                     f"{r['ttft_median_error_vs_server_ms']:+.1f} | {r['tpot_median_error_vs_server_pct']:+.2f} |")
    print("\n".join(lines))
    load = os.getloadavg()
    doc = {"bench": "loadgen", "machine": {"host": platform.node(), "cpus": os.cpu_count(), "pinned": pin,
                                           "loadavg_at_end": load, "python": platform.python_version(),
                                           "event_loop": event_loop_name()},
           "ttft_ms": 200.0, "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {out} (load average at end: {load[0]:.2f})")


if __name__ == "__main__":
    main()
