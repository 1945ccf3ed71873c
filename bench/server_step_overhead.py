"""What streaming costs the engine's step: `k2bench serve`'s real loop (scheduler, runner inputs, AsyncEngine,
HTTP/SSE streaming with detokenisation, Prometheus) with the device replaced by a wait of --device-ms per
step, against C streaming clients. The device wait releases the GIL as waiting on a CUDA event does, so the
engine's mean step minus --device-ms is the host's share that the device does not hide. The stand-in
device queues steps as a GPU stream does: a step starts at its launch or at the end of the step before,
whichever is later. With --async-scheduling on,off both engine loops are measured (on: the next step is
scheduled and launched before the wait). The stand-in process sets itself up as `k2bench serve` does
(server_process: the start-up heap frozen once warm, the collector's pauses counted).

    python bench/server_step_overhead.py --model CKPT --device-ms 7,20 --conc 4,128 --tokens 300 --out DIR

The checkpoint only sizes the runtime (its weights are loaded but never run); the tiny one will do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

SERVER = r"""
import asyncio, signal, sys, time
import torch
from k2bench.engine.runtime.build import EngineOptions, build_engine
from k2bench.engine.runtime.runner import SampledTokens
from k2bench.engine.runtime.runtime_config import RuntimeConfig
from k2bench.engine.runtime.server import serve
from k2bench.engine.runtime.server_process import ProcessSettings, Stalls
from k2bench.engine.runtime.tokenizer import Tokenizer
model, port, device_ms, conc, overlap, detok = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), \
    sys.argv[5] == "1", sys.argv[6] == "1"
process = ProcessSettings()  # as `k2bench serve` sets its process up
stalls = Stalls().install()
rt = RuntimeConfig(max_num_seqs=conc, max_model_len=2048, num_kv_blocks=conc * 2048 // RuntimeConfig.block_size + 8,
                   async_scheduling=overlap)
eng = build_engine(EngineOptions(model=model, device="cpu", backend="torch", runtime=rt))
run = eng.runner
run.execute = lambda inp: None  # a launch returns at once, as a CUDA graph replay does
class Done:  # the device's queue: a step starts when launched or when the one before it ends
    last = 0.0
    def __init__(self):
        Done.last = self.t = max(time.perf_counter(), Done.last) + device_ms / 1e3
    def synchronize(self):  # sleeping releases the GIL, as waiting on a CUDA event does
        time.sleep(max(0.0, self.t - time.perf_counter()))
def sample_launch(logits, sched):  # the step's tokens, ready on the "device" at its end
    t = torch.full((sum(1 for s in sched.seqs if s.samples),), 100, dtype=torch.int64)
    return SampledTokens(t, t, Done())
run.sample_launch = sample_launch
async def main():
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    await serve(eng, Tokenizer(model) if detok else None, host="127.0.0.1", port=port, served_name="stub",
                on_ready=lambda: process.warmed(stalls), stalls=stalls)
try:
    asyncio.run(main())
except asyncio.CancelledError:
    pass
st = eng.stats
print("RESULT" + __import__("json").dumps({"steps": st.steps, "step_s": st.step_seconds, "gc_longest_s": stalls.gc.longest,
                                          "gc_seconds": sum(stalls.gc.seconds)}), flush=True)
"""


async def _clients(port: int, conc: int, tokens: int) -> list[float]:
    import aiohttp

    gaps: list[float] = []

    async def one(session: aiohttp.ClientSession) -> None:
        body = {"model": "stub", "prompt": [5, 6, 7, 8], "max_tokens": tokens, "stream": True, "ignore_eos": True}
        last = None
        async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(one(session) for _ in range(conc)))
    return gaps


def measure(model: str, device_ms: float, conc: int, tokens: int, overlap: bool = True, detok: bool = True) -> dict:
    from k2bench.net import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, model, str(port), str(device_ms), str(conc),
                             str(int(overlap)), str(int(detok))],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        import urllib.request

        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(proc.stdout.read()[-2000:]) from None
                time.sleep(0.5)
        gaps = asyncio.run(_clients(port, conc, tokens))
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT"))
    st = json.loads(line[len("RESULT"):])
    step_ms = st["step_s"] / st["steps"] * 1e3
    return {"device_ms": device_ms, "conc": conc, "async_scheduling": overlap, "detokenize": detok,
            "steps": st["steps"], "engine_step_ms": round(step_ms, 3),
            "host_ms": round(step_ms - device_ms, 3), "client_itl_median_ms": round(statistics.median(gaps) * 1e3, 3),
            "gc_longest_ms": round(st["gc_longest_s"] * 1e3, 2), "gc_ms": round(st["gc_seconds"] * 1e3, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--device-ms", default="7,20")
    ap.add_argument("--conc", default="4,128")
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--async-scheduling", default="on,off", help="engine loops to measure: on, off or on,off")
    ap.add_argument("--no-detokenize", dest="detok", action="store_false",
                    help="serve without the checkpoint's tokenizer (no text in the stream)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    modes = [m.strip() for m in args.async_scheduling.split(",")]
    if not modes or any(m not in ("on", "off") for m in modes):
        ap.error(f"--async-scheduling takes on, off or on,off (got {args.async_scheduling!r})")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for device_ms in (float(v) for v in args.device_ms.split(",")):
        for conc, mode in ((int(c), m) for c in args.conc.split(",") for m in modes):
            row = measure(args.model, device_ms, conc, args.tokens, overlap=mode == "on", detok=args.detok)
            rows.append(row)
            print(f"device {device_ms:5.1f} ms  conc {conc:4d}  async {mode:3s}  engine step "
                  f"{row['engine_step_ms']:7.2f} ms  host adds {row['host_ms']:6.2f} ms  client ITL median "
                  f"{row['client_itl_median_ms']:7.2f} ms  longest gc {row['gc_longest_ms']:6.1f} ms", flush=True)
    doc = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "rows": rows}
    (args.out / "server_step_overhead.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
