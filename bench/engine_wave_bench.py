"""One wave of the design card's sweep level, in the engine alone: where a one-wave level's time goes.

The design card runs each concurrency level as one wave: C prompts of --isl tokens arrive together and
each generates --osl tokens. Its TPOT at high concurrency is far above the decode step because the
prefill of later prompts shares steps with the decode of earlier ones. This script builds the engine as
`k2bench serve` does (triton backend, decode CUDA graphs), runs such a wave through `LLMEngine`'s own
step (no HTTP), and times every step by phase: schedule, prepare, execute (the launch), sample (waits
for the GPU), post. Steps are split into mixed ones (a prefill chunk in them) and pure decode ones, so
the table shows what a prefill chunk costs next to the same number of tokens prefilled alone (the
wave's first step) and what a full-batch decode step costs next to its graph replay. Each request's
TTFT and TPOT come from the step end times, with the harness's definition: TPOT = (last token - first
token) / (tokens - 1). One mixed step and one full-batch decode step can be profiled (--profile).

    python bench/engine_wave_bench.py --model /tmp/k2-width-3 --conc 32,128 --budgets 1024,2048,4096,8192 --out /tmp/out

Each (concurrency, budget) pair is one wave on the same engine; its row has TTFT p50, TPOT p50 and ITL p99
(every gap between two tokens of a request), the points of the budget curve. With --loop engine the wave runs
through `LLMEngine.step` itself, the loop `k2bench serve` runs (async scheduling on, as served): the figures
to set beside a served run (bench/served_vs_alone.py); the phases then stay empty.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from k2bench.engine.runtime.build import EngineOptions, build_engine
from k2bench.engine.runtime.runtime_config import RuntimeConfig
from k2bench.engine.runtime.sequence import SamplingParams, Sequence

PHASES = ("schedule", "prepare", "execute", "sample", "post")


def _prompts(n: int, isl: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(10, 400, (isl,), generator=g).tolist() for _ in range(n)]


def _events(device: torch.device) -> tuple | None:
    """CUDA events around the launch (the model's GPU time); on CPU the launch is the work."""
    if device.type != "cuda":
        return None
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _profile_table(fn, path: Path):
    """fn's result; its kernels' table, by own GPU time, goes to path."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        result = fn()
        if cuda:
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    path.write_text(prof.key_averages().table(sort_by=key, row_limit=40))
    return result


class CompileLog:
    """Names of the Triton kernels compiled while it is on (Triton's post-compile hook), so a step that
    stalls on a JIT compile says which kernel it compiled."""

    def __init__(self) -> None:
        self.names: list[str] = []
        try:
            from triton import knobs

            knobs.runtime.jit_post_compile_hook = self._hook
        except (ImportError, AttributeError):  # no Triton, or one without the hook: nothing is logged
            pass

    def _hook(self, *args, **kwargs) -> None:
        fn = kwargs.get("fn")
        self.names.append(getattr(fn, "name", None) or str(kwargs.get("repr", "?")).split("[")[0])

    def take(self) -> list[str]:
        names, self.names = self.names, []
        return names


def _start_wave(add, prompts: list[list[int]], osl: int) -> tuple[list[Sequence], dict[int, list[float]], float]:
    """The wave's requests, added with `add` at once (greedy, OSL tokens each), their token-time lists, the start."""
    seqs = [Sequence(p, SamplingParams(temperature=0.0, max_tokens=osl, ignore_eos=True)) for p in prompts]
    t_start = time.perf_counter()
    for s in seqs:
        add(s)
    return seqs, {s.seq_id: [] for s in seqs}, t_start


def _wave_result(seqs: list[Sequence], token_times: dict[int, list[float]], steps: list[dict], t_start: float) -> dict:
    ttft = sorted((token_times[s.seq_id][0] - t_start) * 1e3 for s in seqs)
    tpot = sorted((tt[-1] - tt[0]) * 1e3 / (len(tt) - 1) for tt in token_times.values() if len(tt) > 1)
    # the harness's ITL: every gap between two tokens of a request (one token per step here)
    itl = sorted((b - a) * 1e3 for tt in token_times.values() for a, b in zip(tt[:-1], tt[1:], strict=True))
    return {"steps": steps, "ttft_ms": ttft, "tpot_ms": tpot, "itl_ms": itl, "duration_s": time.perf_counter() - t_start}


def run_wave_engine(eng, prompts: list[list[int]], osl: int, compiles: CompileLog | None = None) -> dict:
    """One wave through `LLMEngine.step`, the loop `k2bench serve` runs (async scheduling included when the
    engine's config has it): each step's wall time and kind, no phase split and no GPU time (a step launched
    ahead overlaps the one before it); per-request TTFT and TPOT from the step end times."""
    seqs, token_times, t_start = _start_wave(eng.add, prompts, osl)
    steps = []
    nan = float("nan")
    while eng.has_work:
        t0 = time.perf_counter()
        ahead = eng.stats.steps_ahead
        updated = eng.step()
        t1 = time.perf_counter()
        so = eng.last_sched
        if so is None or eng.idle_step:
            continue
        eng.last_sched = None
        for seq in updated:
            token_times[seq.seq_id].append(t1)
        steps.append({"kind": "mixed" if so.num_prefill_tokens else "decode", "prefill_tokens": so.num_prefill_tokens,
                      # read after post-processing, counted as `is_prefill` did at scheduling: one-token rows
                      # that reach the end of the prompt or past it (a decode, or a prompt's last token)
                      "decodes": sum(1 for s in so.seqs if s.num_new == 1 and s.start + 1 >= s.seq.num_prompt_tokens),
                      "tokens": so.num_tokens,
                      "ms": (t1 - t0) * 1e3, "profiled": False, "launched_next": eng.stats.steps_ahead > ahead,
                      "compiled": compiles.take() if compiles is not None else [], "gpu_ms": nan,
                      **{f"{k}_ms": nan for k in PHASES}})
    return _wave_result(seqs, token_times, steps, t_start)


def run_wave(eng, prompts: list[list[int]], osl: int, profile_dir: Path | None = None,
             compiles: CompileLog | None = None) -> dict:
    """Every step of one wave, timed by phase; per-request TTFT and TPOT from the step end times."""
    sch, run = eng.scheduler, eng.runner
    seqs, token_times, t_start = _start_wave(sch.add, prompts, osl)
    steps = []
    profiled = {"mixed": False, "decode": False}
    while sch.has_work:
        t_sched = time.perf_counter()
        so = sch.schedule()
        for seq in so.preempted:
            run.release(seq)
        kind = "mixed" if so.num_prefill_tokens else "decode"
        n_dec = sum(1 for s in so.seqs if not s.is_prefill)
        # profiled: a late mixed step (most decodes next to the chunk) and a full-batch decode step
        want_profile = (profile_dir is not None and not profiled[kind]
                        and n_dec >= (len(seqs) * 7 // 8 if kind == "mixed" else len(seqs)))

        def body(so=so):
            t = [time.perf_counter()]
            inp = run.prepare(so)
            t.append(time.perf_counter())
            ev = _events(run.device)
            if ev:
                ev[0].record()
            logits = run.execute(inp)
            if ev:
                ev[1].record()
            t.append(time.perf_counter())
            toks = run.sample(logits, so)
            t.append(time.perf_counter())
            updated = sch.postprocess(so, toks)
            t.append(time.perf_counter())
            return t, ev, updated

        if want_profile:
            t, ev, updated = _profile_table(body, profile_dir / f"profile_{kind}_step.txt")
            profiled[kind] = True
        else:
            t, ev, updated = body()
        if ev:  # sampling waits for the logits, not for the stream the end event was recorded on
            ev[1].synchronize()
        for seq in updated:
            token_times[seq.seq_id].append(t[-1])
            if seq.is_finished:
                run.release(seq)
        ph = dict(zip(PHASES, [t[0] - t_sched] + [y - x for x, y in zip(t[:-1], t[1:], strict=True)], strict=True))
        steps.append({"kind": kind, "prefill_tokens": so.num_prefill_tokens, "decodes": n_dec,
                      "tokens": so.num_tokens, "ms": (t[-1] - t_sched) * 1e3, "profiled": want_profile,
                      "compiled": compiles.take() if compiles is not None else [],
                      "gpu_ms": ev[0].elapsed_time(ev[1]) if ev else (t[2] - t[1]) * 1e3, **{f"{k}_ms": v * 1e3 for k, v in ph.items()}})
    return _wave_result(seqs, token_times, steps, t_start)


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs: what one more decode adds to a mixed step's GPU time."""
    if len(set(xs)) < 2:
        return float("nan")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def summarise(wave: dict, conc: int) -> dict:
    steps = [s for s in wave["steps"] if not s["profiled"]]
    mixed = [s for s in steps if s["kind"] == "mixed"]
    full = [s for s in steps if s["kind"] == "decode" and s["decodes"] == conc]
    first = wave["steps"][0]
    out = {
        "steps": len(wave["steps"]), "mixed_steps": len(mixed), "duration_s": round(wave["duration_s"], 3),
        "mixed_total_s": round(sum(s["ms"] for s in mixed) / 1e3, 3),
        "decode_total_s": round(sum(s["ms"] for s in steps if s["kind"] == "decode") / 1e3, 3),
        "first_step_ms": round(first["ms"], 3), "first_step_prefill_tokens": first["prefill_tokens"],
        "mixed_step_ms_median": round(_med([s["ms"] for s in mixed]), 3),
        "mixed_prefill_tokens_median": _med([s["prefill_tokens"] for s in mixed]),
        "mixed_decodes_median": _med([s["decodes"] for s in mixed]),
        "mixed_gpu_ms_per_decode": round(_slope([s["decodes"] for s in mixed], [s["gpu_ms"] for s in mixed]), 4),
        "full_decode_step_ms_median": round(_med([s["ms"] for s in full]), 3),
        "full_decode_gpu_ms_median": round(_med([s["gpu_ms"] for s in full]), 3),
        "compiles": [[i, s["compiled"]] for i, s in enumerate(wave["steps"]) if s["compiled"]],
        "ttft_ms_p50": round(_med(wave["ttft_ms"]), 1), "ttft_ms_max": round(max(wave["ttft_ms"]), 1),
        "tpot_ms_p50": round(_med(wave["tpot_ms"]), 3),
        "itl_ms_p99": round(float(np.percentile(wave["itl_ms"], 99, method="linear")), 2) if wave["itl_ms"] else None,
    }
    for kind, rows in (("mixed", mixed), ("full_decode", full)):
        for p in PHASES:
            out[f"{kind}_{p}_ms_median"] = round(_med([s[f"{p}_ms"] for s in rows]), 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--conc", default="128", help="comma list of concurrencies; each runs every budget")
    ap.add_argument("--isl", type=int, default=8192)
    ap.add_argument("--osl", type=int, default=1024)
    ap.add_argument("--budgets", default=str(RuntimeConfig.max_num_batched_tokens),
                    help="comma list of --max-num-batched-tokens values, one wave each")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run on the tiny checkpoint")
    ap.add_argument("--kv-cache-memory", type=float, default=16.0, help="GiB, as the design card's server")
    ap.add_argument("--profile", action="store_true", help="profile one mixed and one full decode step")
    ap.add_argument("--loop", choices=("phases", "engine"), default="phases",
                    help="phases: the step taken apart and timed by phase, one step at a time (default); engine: "
                         "LLMEngine.step as `k2bench serve` runs it, async scheduling included (no phases)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    concs = [int(c) for c in args.conc.split(",")]
    if args.loop == "engine" and args.profile:
        ap.error("--profile needs --loop phases")
    rt = RuntimeConfig(max_num_seqs=max(concs), max_model_len=args.isl + args.osl + 64,
                       kv_cache_memory=args.kv_cache_memory)
    eng = build_engine(EngineOptions(model=args.model, device=args.device, backend="triton" if args.device == "cuda" else "torch",
                                     runtime=rt))
    # As `k2bench serve` starts: the engine's warm-up (per-shape attention plans), then a short wave so the
    # kernels of the prefill and decode paths are compiled, as the sweep's lower levels would have done.
    eng.warm_up()
    run_wave(eng, _prompts(min(concs[0], 4), args.isl, 1), 8)
    compiles = CompileLog()
    warmed = rt.max_num_batched_tokens
    rows = []
    cases = [(c, int(b)) for c in concs for b in args.budgets.split(",")]
    for i, (conc, budget) in enumerate(cases):
        eng.scheduler.config.max_num_batched_tokens = budget
        if budget > warmed:  # as a server started with this budget warms up: the MoE kernels' size variants
            eng.runner.model.warm_up_mlps(budget)  # up to it, not compiled inside the wave (skewing its TTFT)
            warmed = budget
        if args.loop == "engine":
            wave = run_wave_engine(eng, _prompts(conc, args.isl, 2), args.osl, compiles)
        else:
            wave = run_wave(eng, _prompts(conc, args.isl, 2), args.osl, args.out if args.profile and i == 0 else None,
                            compiles)
        row = {"budget": budget, "conc": conc, "isl": args.isl, "osl": args.osl, "loop": args.loop,
               **summarise(wave, conc)}
        rows.append(row)
        (args.out / f"wave_steps_{conc}_{budget}.json").write_text(json.dumps(wave))
        (args.out / "wave_bench.json").write_text(json.dumps({"model": args.model, "rows": rows}, indent=1))  # so far
        print(f"conc {conc} budget {budget}: {row['steps']} steps in {row['duration_s']:.1f} s; {row['mixed_steps']} mixed "
              f"({row['mixed_total_s']:.1f} s, median {row['mixed_step_ms_median']:.1f} ms for "
              f"{row['mixed_prefill_tokens_median']:.0f} prefill + {row['mixed_decodes_median']:.0f} decode tokens, "
              f"{row['mixed_gpu_ms_per_decode']:.3f} ms more GPU time per decode); "
              f"first step {row['first_step_ms']:.1f} ms for {row['first_step_prefill_tokens']} prefill tokens; "
              f"full-batch decode {row['full_decode_step_ms_median']:.2f} ms (execute+copies on GPU "
              f"{row['full_decode_gpu_ms_median']:.2f}); TTFT p50 {row['ttft_ms_p50']:.0f} ms, max "
              f"{row['ttft_ms_max']:.0f}; TPOT p50 {row['tpot_ms_p50']:.2f} ms; ITL p99 {row['itl_ms_p99']} ms", flush=True)
        for step, names in row["compiles"]:
            print(f"  step {step} compiled {', '.join(names)} ({wave['steps'][step]['ms']:.0f} ms)", flush=True)
        if args.loop == "phases":
            print("  mixed phases (ms): " + "  ".join(f"{p} {row[f'mixed_{p}_ms_median']:.2f}" for p in PHASES)
                  + " | full decode: " + "  ".join(f"{p} {row[f'full_decode_{p}_ms_median']:.2f}" for p in PHASES),
                  flush=True)
    eng.shutdown()
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    doc = {"model": args.model, "device": device, "torch": torch.__version__, "rows": rows}
    (args.out / "wave_bench.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
