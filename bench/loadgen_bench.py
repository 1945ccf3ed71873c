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

Further modes (``--mode``):

- ``hotpath``: the client's own per-message work measured alone (CPU time per message over 200k
  messages formatted as the test server sends them): the SSE framing split and the JSON parse, the
  part of the per-token cost that is k2bench's own code rather than aiohttp's and the event loop's.
- ``reruns``: five reruns of one level (concurrency 64, 2 ms gap, 512 tokens); the run-to-run spread
  (coefficient of variation) of steady-state throughput against whole-level throughput.
- ``rate``: Poisson arrivals at 50, 200 and 1,000 requests/s (open loop, seconds ``--rate-seconds``
  each, 16 output tokens per request at a 5 ms gap) against one test server: the schedule's rate, the
  rate achieved, the send lag p50/p99 (actual - intended send) and the CPU the client used (user +
  system of this process over the level, as a fraction of one core).
- ``procs``: 1, 2, 4, 8 client processes (``--client-procs``) at concurrency 1,024, 1k in / 1k out, a
  10 ms gap (102k tokens/s asked for), against several test-server processes sharing one port
  (``--reuse-port``), each recording its streams (``--record``): tokens/s carried, the client's own
  figures and validity, and TPOT error against what the servers did, per setting. Sized for the
  16-core device machine (bench/device_loadgen.sh); ``--quick`` is a CPU-sized smoke run.
- ``transport``: client CPU per streamed token of the raw transport against aiohttp's path (and, with
  ``--reference-client PATH``, InferenceX's client), ``--repeats`` interleaved rounds at concurrency 64, a
  2 ms gap, 1,024 tokens (bench/loadgen_transport.py).

    python bench/loadgen_bench.py                 # table + results/bench/loadgen_bench.json
    python bench/loadgen_bench.py --quick --out /tmp/lg.json
    python bench/loadgen_bench.py --mode reruns --out /tmp/reruns.json
    python bench/loadgen_bench.py --mode procs --servers 8 --out $OUT/procs.json
    python bench/loadgen_bench.py --mode rate --out /tmp/rate.json
    python bench/loadgen_bench.py --mode transport --repeats 5 --reference-client PATH/benchmark_serving.py
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

from k2bench.harness.load import openloop, schedule, transport
from k2bench.harness.load.loadgen import LevelSpec, event_loop_name, run, run_level
from k2bench.harness.load.procs import run_level_procs
from k2bench.harness.load.selfmeasure import SelfMeter, combine
from k2bench.harness.load.transport import transport_choice
from k2bench.harness.measure.metrics import summarize_level
from k2bench.harness.measure.validity import ValidityRules, client_bottleneck
from k2bench.net import free_port
from k2bench.workloads.prompts import Prompt

# (concurrency, ttft ms, gap ms, output tokens per request)
CASES = [(64, 200.0, 20.0, 256), (128, 200.0, 20.0, 256), (64, 200.0, 2.0, 1024), (128, 200.0, 2.0, 1024)]
QUICK = [(64, 200.0, 20.0, 64), (128, 200.0, 20.0, 64), (64, 200.0, 2.0, 256)]


def _start_server(port: int, ttft_ms: float, itl_ms: float, core: int | None, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "k2bench.harness.load.testserver", "--port", str(port),
           "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), *extra]
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
        meter = SelfMeter()
        records = run(run_level(spec, prompts, meter=meter))
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
        "client": {k: round(v, 3) for k, v in meter.result.items()},
    }


def _cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.mean(values) * 100


def run_reruns(n: int, conc: int, itl_ms: float, osl: int, waves: int, core: int | None) -> dict:
    """Five reruns of one level on a fresh server each: whole-level against steady-state throughput."""
    rows = []
    for i in range(n):
        port = free_port()
        server = _start_server(port, 50.0, itl_ms, core)
        try:
            prompts = [Prompt(input_len=128, output_len=osl, token_ids=[(7 * i + j) % 30000 for j in range(128)])]
            spec = LevelSpec(base_url=f"http://127.0.0.1:{port}", model="k2bench-test", concurrency=conc,
                             num_prompts=waves * conc, num_warmup=conc, timeout_s=600)
            point = summarize_level(run(run_level(spec, prompts)), concurrency=conc, num_gpus=1)
        finally:
            server.kill()
            server.wait()
        rows.append({"rerun": i, "output_tput": point["output_tput_per_gpu"],
                     "steady_output_tput": point["steady_output_tput_per_gpu"],
                     "duration_s": point["duration_s"], "steady_duration_s": point["steady_duration_s"]})
        print(json.dumps(rows[-1]), file=sys.stderr)
    whole, steady = [r["output_tput"] for r in rows], [r["steady_output_tput"] for r in rows]
    return {"concurrency": conc, "itl_ms": itl_ms, "osl": osl, "waves": waves, "reruns": rows,
            "whole_cv_pct": _cv(whole), "steady_cv_pct": _cv(steady),
            "steady_spread_over_whole": _cv(steady) / _cv(whole)}


def run_rates(rates: list[float], seconds: float, core: int | None) -> list[dict]:
    """Open-loop Poisson levels against one test server (TTFT 20 ms, 16 tokens 5 ms apart): how well the
    client keeps the schedule, and at what CPU."""
    rows = []
    for rate in rates:
        port = free_port()
        server = _start_server(port, 20.0, 5.0, core)
        try:
            offsets = schedule.arrival_offsets(None, rate, 1.0, seed=7, duration_s=seconds)
            prompts = [Prompt(input_len=32, output_len=16, token_ids=[(i + j) % 30000 for j in range(32)])
                       for i in range(64)]
            spec = LevelSpec(base_url=f"http://127.0.0.1:{port}", model="k2bench-test",
                             concurrency=len(offsets), num_prompts=len(offsets), num_warmup=0, timeout_s=120)
            cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            records = run(openloop.run_rate_level(spec, prompts, offsets, rate, 0))
            cpu1, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - wall0
        finally:
            server.kill()
            server.wait()
        fig = openloop.level_figures(records, rate)
        cpu_s = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        rows.append({"rate": rate, "requests": len(records), "failed": sum(not r.success for r in records),
                     "scheduled_rate": openloop.scheduled_rate(records), "achieved_rate": fig["achieved_rate"],
                     "send_lag_p50_ms": fig["send_lag_p50_ms"], "send_lag_p99_ms": fig["send_lag_p99_ms"],
                     "client_cpu_s": round(cpu_s, 3), "wall_s": round(wall, 3),
                     "client_cpu_cores": round(cpu_s / wall, 3)})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def _start_servers(count: int, cores: list[int], itl_ms: float, folder: Path) -> tuple[int, list]:
    port = free_port()
    servers = [_start_server(port, 50.0, itl_ms, cores[i % len(cores)] if cores else None, "--reuse-port",
                             "--record", str(folder / f"server{i}.json")) for i in range(count)]
    return port, servers


def _stop_servers(servers: list, folder: Path) -> list[dict]:
    import signal as sig

    for s in servers:
        s.send_signal(sig.SIGTERM)
    for s in servers:
        s.wait(30)
    streams = []
    for f in sorted(folder.glob("server*.json")):
        streams += json.loads(f.read_text())["streams"]
        f.unlink()
    return streams


def run_procs(settings: list[int], conc: int, isl: int, osl: int, itl_ms: float, servers: int,
              server_cores: list[int]) -> list[dict]:
    """Each client-process count against fresh test servers; TPOT per request against the servers' record.
    Warmup requests ask for 16 tokens (they open the connections); measured ones for ``osl``."""
    import tempfile

    rules = ValidityRules()
    warm = [Prompt(input_len=8, output_len=16, token_ids=[1] * 8) for _ in range(conc)]
    measured = [Prompt(input_len=isl + i, output_len=osl, token_ids=[(i + j) % 30000 for j in range(isl + i)])
                for i in range(conc)]
    rows = []
    for procs in settings:
        folder = Path(tempfile.mkdtemp(prefix="k2lg"))
        port, srv = _start_servers(servers, server_cores, itl_ms, folder)
        try:
            for _ in range(300):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                        break
                except OSError:
                    time.sleep(0.1)
            spec = LevelSpec(base_url=f"http://127.0.0.1:{port}", model="k2bench-test", concurrency=conc,
                             num_prompts=conc, num_warmup=conc, timeout_s=600)
            if procs == 1:
                meter = SelfMeter()
                records, meters = run(run_level(spec, warm + measured, meter=meter)), []
                meters = [meter.result]
            else:
                records, meters = run(run_level_procs(spec, warm + measured, procs))
        finally:
            truth = {s["prompt_tokens"]: s for s in _stop_servers(srv, folder)}
        point = summarize_level(records, concurrency=conc, num_gpus=1)
        client = combine(meters)
        errors = []
        for r in records:
            s = truth.get(r.requested_input_tokens)
            if r.warmup or not r.success or s is None or s["messages"] < 2:
                continue
            mine = (r.token_ns[-1] - r.token_ns[0]) / 1e6 / (r.output_tokens - 1)
            theirs = (s["last_sent"] - s["first_sent"]) * 1e3 / (s["messages"] - 1)
            errors.append((mine - theirs) / theirs * 100)
        why = client_bottleneck(client, rules)
        rows.append({"procs": procs, "concurrency": conc, "completed": point["completed"], "failed": point["failed"],
                     "output_tok_s": point["output_tput_per_gpu"], "steady_output_tok_s":
                     point["steady_output_tput_per_gpu"], "asked_tok_s": conc / (itl_ms / 1e3),
                     "tpot_err_median_pct": statistics.median(errors) if errors else None,
                     "tpot_err_p99_abs_pct": sorted(map(abs, errors))[int(0.99 * (len(errors) - 1))] if errors else None,
                     "client_cpu_cores": client["cpu_cores"], "demand_max": client["demand_max"],
                     "lag_p99_ms": client["lag_p99_ms"], "valid_client": why is None, "why": why})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def run_hotpath(n: int = 200_000) -> list[dict]:
    """CPU per message of the SSE handling: the framing split, the message's parse, and each read of the raw
    transport whole (httptools' chunk decoding included), one message per read as the test server sends."""
    import asyncio

    from k2bench.harness.load import transport
    from k2bench.harness.load.sse import _Stream

    head = b'{"id":"cmpl-7","object":"text_completion","created":0,"model":"k2bench-test","choices":[{"index":0,"text":"'
    msgs = [head + b" t%d" % (i % 30000) + b'","logprobs":null,"finish_reason":null}],"usage":null}' for i in range(n)]
    chunks = [b"data: " + m + b"\n\n" for m in msgs]
    halves = [(c[:40], c[40:]) for c in chunks]
    wire = [b"%x\r\n%s\r\n" % (len(c), c) for c in chunks]

    def cpu(fn) -> float:
        t0 = time.process_time()
        fn()
        return (time.process_time() - t0) / n * 1e6

    def split() -> None:  # what stream_one did inline before _Stream.feed
        for c in chunks:
            parts = c.split(b"\n\n")
            parts.pop()
            for part in parts:
                if part[:6] == b"data: " and b"\n" not in part:
                    part[6:]

    def fed(pieces) -> _Stream:
        state = _Stream([])
        for p in pieces:
            state.feed(p, 1)
        return state

    def split_reads() -> None:
        state = _Stream([])
        for a, b in halves:
            state.feed(a, 1)
            state.feed(b, 1)

    def raw_reads() -> None:
        loop = asyncio.new_event_loop()
        conn = transport._Conn()
        conn.transport = type("T", (), {"close": lambda self: None})()
        conn.begin(_Stream([]), loop.create_future())
        conn.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for w in wire:
            conn.data_received(w)
        loop.close()

    state, state2 = _Stream([]), _Stream([])
    rows = [{"step": "SSE framing split (per chunk, the split alone)", "us_per_message": cpu(split)},
            {"step": "message parse (orjson) and token check", "us_per_message":
             cpu(lambda: [state.payload(m, 1) for m in msgs])},
            {"step": "_Stream.feed, one message per read (split + parse)", "us_per_message":
             cpu(lambda: fed(chunks))},
            {"step": "the same through feed's general path (_Stream.split), as before its one-scan path",
             "us_per_message": cpu(lambda: [state2.split(c, 1) for c in chunks])},
            {"step": "_Stream.feed, each message in two reads", "us_per_message": cpu(split_reads)},
            {"step": "raw transport read: stamp + httptools chunk decode + feed", "us_per_message": cpu(raw_reads)}]
    assert len(state.token_ns) == len(state2.token_ns) == len(fed(chunks).token_ns) == n
    return rows


def _table(header: tuple[str, ...], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/bench/loadgen_bench.json")
    ap.add_argument("--quick", action="store_true", help="shorter streams, for a smoke run")
    ap.add_argument("--waves", type=int, default=2, help="measured requests = waves x concurrency")
    ap.add_argument("--no-pin", action="store_true", help="do not pin server and client to cores")
    ap.add_argument("--mode", choices=("accuracy", "hotpath", "reruns", "procs", "rate", "transport"),
                    default="accuracy")
    ap.add_argument("--repeats", type=int, default=5, help="transport mode: interleaved rounds")
    ap.add_argument("--reference-client", metavar="PATH",
                    help="transport mode: InferenceX's utils/bench_serving/benchmark_serving.py, measured too")
    ap.add_argument("--rate-seconds", type=float, default=5.0, help="rate mode: seconds of arrivals per rate")
    ap.add_argument("--reruns", type=int, default=5)
    ap.add_argument("--servers", type=int, default=8, help="procs mode: test-server processes sharing the port")
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    pin = not args.no_pin and len(cores) >= 2
    if args.mode == "procs":
        _main_procs(args, cores, pin)
        return
    if pin:
        os.sched_setaffinity(0, {cores[1]})
    if args.mode == "hotpath":
        rows = run_hotpath()
        print(_table(("step", "client CPU us/message"), [(r["step"], f"{r['us_per_message']:.2f}") for r in rows]))
        _write(args.out, {"bench": "loadgen-hotpath", "machine": _machine(pin), "rows": rows})
        return
    if args.mode == "transport":
        import loadgen_transport as lt

        if args.reference_client and not Path(args.reference_client).is_file():
            sys.exit(f"error: --reference-client {args.reference_client}: no such file")
        if args.repeats < 1:
            sys.exit("error: --repeats must be at least 1")
        res = lt.run_transport(args.repeats, args.reference_client, cores[0] if pin else None, _start_server, _cpu_s)
        print(_table(lt.HEADER, lt.table(res)))
        _write(args.out, {"bench": "loadgen-transport", "machine": _machine(pin), **res})
        return
    if args.mode == "rate":
        rows = run_rates([50.0, 200.0, 1000.0], 2.0 if args.quick else args.rate_seconds, cores[0] if pin else None)
        print(_table(("rate asked /s", "requests", "failed", "schedule's rate /s", "achieved /s", "send lag p50 ms",
                      "send lag p99 ms", "client CPU (cores)"),
                     [(f"{r['rate']:g}", r["requests"], r["failed"], f"{r['scheduled_rate']:.1f}",
                       f"{r['achieved_rate']:.1f}", f"{r['send_lag_p50_ms']:.2f}", f"{r['send_lag_p99_ms']:.2f}",
                       f"{r['client_cpu_cores']:.2f}") for r in rows]))
        _write(args.out, {"bench": "loadgen-rate", "machine": _machine(pin), "rows": rows})
        return
    if args.mode == "reruns":
        res = run_reruns(args.reruns, 64, 2.0, 128 if args.quick else 512, args.waves, cores[0] if pin else None)
        print(_table(("rerun", "whole-level output tok/s", "steady-state output tok/s", "duration s", "steady s"),
                     [(r["rerun"], f"{r['output_tput']:.0f}", f"{r['steady_output_tput']:.0f}",
                       f"{r['duration_s']:.2f}", f"{r['steady_duration_s']:.2f}") for r in res["reruns"]]))
        print(f"spread (CV) of {args.reruns} reruns: whole level {res['whole_cv_pct']:.2f}%, steady state "
              f"{res['steady_cv_pct']:.2f}% ({res['steady_spread_over_whole']:.2f}x the whole level's)")
        _write(args.out, {"bench": "loadgen-reruns", "machine": _machine(pin), **res})
        return
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
    _write(args.out, {"bench": "loadgen", "machine": _machine(pin), "ttft_ms": 200.0, "rows": rows})


def _main_procs(args, cores: list[int], pin: bool) -> None:
    """Servers on the first cores, the client (and its worker processes, which inherit it) on the rest."""
    servers = 2 if args.quick else args.servers
    server_cores = cores[:servers] if pin and len(cores) > servers else []
    if server_cores:
        os.sched_setaffinity(0, set(cores[servers:]))
    conc, isl, osl, itl = (64, 64, 128, 10.0) if args.quick else (1024, 1024, 1024, 10.0)
    settings = [1, 2] if args.quick else [1, 2, 4, 8]
    rows = run_procs(settings, conc, isl, osl, itl, servers, server_cores)
    print(_table(("client procs", "asked tok/s", "carried tok/s", "steady tok/s", "client CPU cores",
                  "demand (busiest)", "lag p99 ms", "TPOT err p50 %", "TPOT abs err p99 %", "client valid"),
                 [(r["procs"], f"{r['asked_tok_s']:.0f}", f"{r['output_tok_s']:.0f}", f"{r['steady_output_tok_s']:.0f}",
                   f"{r['client_cpu_cores']:.2f}", f"{r['demand_max']:.2f}", f"{r['lag_p99_ms']:.1f}",
                   f"{r['tpot_err_median_pct']:+.2f}", f"{r['tpot_err_p99_abs_pct']:.2f}",
                   "yes" if r["valid_client"] else "no") for r in rows]))
    _write(args.out, {"bench": "loadgen-procs", "machine": _machine(pin), "servers": servers,
                      "server_cores": server_cores, "concurrency": conc, "isl": isl, "osl": osl, "itl_ms": itl,
                      "rows": rows})


def _machine(pin: bool) -> dict:
    return {"host": platform.node(), "cpus": os.cpu_count(), "pinned": pin, "loadavg_at_end": os.getloadavg(),
            "python": platform.python_version(), "event_loop": event_loop_name(),
            "transport": transport_choice() if transport.httptools is not None else "aiohttp (httptools missing)"}


def _write(path: str, doc: dict) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {out} (load average at end: {doc['machine']['loadavg_at_end'][0]:.2f})")


if __name__ == "__main__":
    main()
