"""A small database with known numbers for the dashboard tests.

Two engines, four commits each on main (one day apart) plus one run on a feature branch. Requests
are synthesised with exact timing (every request of a level: TTFT = ttft(c), then OSL tokens
``gap(c)`` apart, in waves of c), summarised by the real metrics code and stored through the
real Store, so the expected values below follow from the timing model, not from the code under
test. The bundled engine's last commit is a regression: every token gap is 25% longer, so its
throughput drops by ~20% at every level and a change point is recorded for it.

Each level also carries telemetry from the same model: one GPU drawing a constant ``watts(c)`` over
the level (11 samples, counter included) through the real energy summary, a price of
``PRICE`` per GPU-hour through the real cost code, and server gauges (KV usage c/64, c running),
so J/token = watts / tok/s and $/Mtok = PRICE / 3600 / tok/s x 1e6 are known in advance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure.metrics import summarize_level
from k2bench.harness.store import Store
from k2bench.harness.telemetry import cost, power
from k2bench.harness.telemetry.gpu import Reading

ISL, OSL = 128, 16
LEVELS = (4, 8, 16, 32)
ENGINES = {"bundled": 1.0, "vllm": 0.8}  # gap scale: vllm is faster per token
COMMITS = ["a1" * 20, "b2" * 20, "c3" * 20, "d4" * 20]
REGRESSION_FACTOR = 1.25  # token gaps of the bundled engine at the last commit
CULPRIT = "e5" * 20  # the commit between the last two that a bisection named (it has no run of its own)
T0 = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc)
# what a CPU run records as its hardware: long, and the same for every configuration here
HARDWARE = "Intel(R) Xeon(R) Platinum 8480C Processor @ 2.00GHz"
PRICE = 2.0  # US$ per GPU-hour


def watts(engine: str, c: int) -> float:
    return (200.0 + 10.0 * c) * (0.9 if engine == "vllm" else 1.0)


def telemetry(engine: str, c: int, point: dict) -> dict:
    """The level's energy, cost and server metrics from the fixture's power and gauge model."""
    n = 11  # samples across the level, ends included
    t = [k * point["duration_s"] / (n - 1) for k in range(n)]
    w = watts(engine, c)
    window = power.Window(ids=["0"], names=["Fixture GPU"], vendor="fixture", t=t,
                          readings=[[Reading(power_w=w, energy_j=w * x, sm_clock_mhz=1900.0 - c, mem_clock_mhz=2600.0)
                                     for x in t]])
    energy = power.summarize(window, point["input_tokens"] + point["output_tokens"], point["output_tokens"])
    price = cost.level_cost(PRICE, point["tput_per_gpu"], point["output_tput_per_gpu"], "fixture price")
    gauges = {"k2bench_kv_cache_usage_perc": [c / 64] * n, "k2bench_num_requests_running": [float(c)] * n}
    server = {"counters": {"k2bench_prompt_tokens_total": point["input_tokens"]},
              "gauges": {k: {"mean": v[0], "max": v[0]} for k, v in gauges.items()},
              "raw": {"t_s": t, "gauges": gauges}}
    assert energy["power_valid"], energy["reason"]
    return {"energy": energy, "cost": price, "server_metrics": server, "j_per_token": energy["j_per_token"],
            "tokens_per_j": energy["tokens_per_j"], "usd_per_mtok": price["usd_per_mtok"],
            "usd_per_mtok_output": price["usd_per_mtok_output"], **server_split(c)}


SERVER_TTFT_GAP_MS = 2.0  # the fixture's client TTFT is the server's (queue + prefill) plus this


def server_split(c: int) -> dict:
    """What the fixture's server timed: a quarter of its TTFT queued, the rest prefill."""
    server = ttft_ms(c) - SERVER_TTFT_GAP_MS
    queue, prefill = 0.25 * server, 0.75 * server
    return {"server_ttft_ms": server, "server_queue_ms": {"mean": queue, "median": queue, "p99": queue},
            "server_prefill_ms": {"mean": prefill, "median": prefill, "p99": prefill}}


def ttft_ms(c: int) -> float:
    return 40.0 + 2.0 * c


def gap_ms(engine: str, c: int, commit_index: int) -> float:
    g = ENGINES[engine] * 4.0 * (1.0 + c / 16.0)
    if engine == "bundled" and commit_index == len(COMMITS) - 1:
        g *= REGRESSION_FACTOR
    return g


def level_records(c: int, ttft: float, gap: float, waves: int = 2, isl: int = ISL,
                  osl: int = OSL) -> list[RequestRecord]:
    recs, t = [], 1_000_000_000
    e2el_ns = int((ttft + (osl - 1) * gap) * 1e6)
    for w in range(waves):
        for i in range(c):
            send = t + w * (e2el_ns + 1_000_000)
            tokens = [send + int((ttft + k * gap) * 1e6) for k in range(osl)]
            recs.append(RequestRecord(index=w * c + i, concurrency=c, warmup=False, requested_input_tokens=isl,
                                      requested_output_tokens=osl, send_ns=send, token_ns=tokens,
                                      end_ns=tokens[-1] + 100_000, prompt_tokens=isl, output_tokens=osl,
                                      success=True))
    return recs


@dataclass
class Fixture:
    url: str
    runs: dict[tuple[str, int], int] = field(default_factory=dict)  # (engine, commit index) -> run id
    feature_run: int = 0
    unfinished_run: int = 0  # started, no level finished (a sweep stopped during its first level)
    fingerprints: dict[str, str] = field(default_factory=dict)


def meta(engine: str, commit: str, branch: str, when: datetime) -> dict:
    return {"engine": engine, "engine_version": "1.0", "engine_flags": {"max_num_seqs": 64, "engine": engine},
            "server_command": f"{engine} serve tiny-k2 --tp 1", "model": "tiny-k2", "precision": "mxfp4",
            "hardware": HARDWARE, "num_gpus": 1, "tp": 1, "workload": "fixture", "isl": ISL, "osl": OSL,
            "commit": commit, "branch": branch, "started_at": when.isoformat(), "tags": {"fixture": "yes"}}


def roofline(engine: str, commit_index: int) -> dict:
    """A limit exactly twice the measured levels on both axes: every level sits at 50% of it."""
    return {"hardware": "H200", "dtype": "bf16", "source": "fixture", "points": [
        {"concurrency": c, "tput_per_gpu": 2 * expected_tput(engine, c, commit_index),
         "interactivity": 2 * expected_interactivity(engine, c, commit_index)} for c in LEVELS]}


def add_run(store: Store, engine: str, commit_index: int, branch: str, when: datetime,
            with_roofline: bool = False) -> int:
    m = meta(engine, COMMITS[commit_index], branch, when)
    if with_roofline:
        m["extra"] = {"roofline": roofline(engine, commit_index)}
    run_id = store.create_run(m)
    for c in LEVELS:
        recs = level_records(c, ttft_ms(c), gap_ms(engine, c, commit_index))
        point = summarize_level(recs, concurrency=c, num_gpus=1)
        point.update(telemetry(engine, c, point))
        if with_roofline:
            point["pct_roofline"] = 100.0 * point["tput_per_gpu"] / (2 * expected_tput(engine, c, commit_index))
        store.add_point(run_id, point, recs)
    store.finish_run(run_id, "complete")
    return run_id


def build(url: str) -> Fixture:
    fx = Fixture(url)
    store = Store.open(url)
    try:
        for engine in ENGINES:
            for i in range(len(COMMITS)):
                # the bundled engine runs an hour after vllm each day: its regressed run is the newest
                when = T0 + timedelta(days=i, hours=1 if engine == "bundled" else 0)
                fx.runs[(engine, i)] = add_run(store, engine, i, "main", when)
        fx.feature_run = add_run(store, "vllm", 1, "feature-x", T0 + timedelta(days=1, hours=6), with_roofline=True)
        fx.unfinished_run = store.create_run(meta("vllm", COMMITS[-1], "main", T0 + timedelta(days=4)))
        store.finish_run(fx.unfinished_run, "partial")
        for engine in ENGINES:
            fx.fingerprints[engine] = store.get_run(fx.runs[(engine, 0)])["fingerprint"]
        last = fx.runs[("bundled", len(COMMITS) - 1)]
        before = expected_tput("bundled", 32, 0)
        after = expected_tput("bundled", 32, len(COMMITS) - 1)
        store.replace_change_points(fx.fingerprints["bundled"], "main", [{
            "metric": "tput_per_gpu", "concurrency": 32, "run_id": last, "commit": COMMITS[-1],
            "detected_at": (T0 + timedelta(days=4)).isoformat(), "mean_before": before, "mean_after": after,
            "rel_change": after / before - 1.0, "p_value": 0.001}])
        store.add_culprit({"fingerprint": fx.fingerprints["bundled"], "branch": "main", "metric": "tput_per_gpu",
                           "concurrency": 32, "good": COMMITS[-2], "bad": COMMITS[-1], "first_bad": CULPRIT,
                           "subject": "scheduler: longer token gaps", "steps": []})
    finally:
        store.close()
    return fx


def expected_tput(engine: str, c: int, commit_index: int) -> float:
    """tok/s/GPU from the timing model: two waves of c requests, 1 ms apart, each ending 0.1 ms after
    its last token (duration = first send to last end)."""
    ttft, gap = ttft_ms(c), gap_ms(engine, c, commit_index)
    e2el = ttft + (OSL - 1) * gap
    duration_ms = 2 * e2el + 1.0 + 0.1
    return 2 * c * (ISL + OSL) / (duration_ms / 1000.0)


def expected_interactivity(engine: str, c: int, commit_index: int) -> float:
    return 1000.0 / gap_ms(engine, c, commit_index)


def add_published_workload_run(url: str, model: str = "amd/Kimi-K2.5-MXFP4", isl: int = 8192,
                               osl: int = 1024) -> int:
    """One run at the published reference's model and lengths (a GPU run's shape, at small levels)."""
    store = Store.open(url)
    try:
        doc = meta("vllm", COMMITS[0], "main", T0 + timedelta(days=5))
        doc.update(model=model, isl=isl, osl=osl, workload="8k1k", hardware="MI355X", num_gpus=4, tp=4)
        run_id = store.create_run(doc)
        for c in (4, 8):
            recs = level_records(c, 300.0 + 10 * c, 8.0 + c / 4, isl=isl, osl=osl)
            store.add_point(run_id, summarize_level(recs, concurrency=c, num_gpus=4), recs)
        store.finish_run(run_id, "complete")
    finally:
        store.close()
    return run_id


INVALID_REASON = "12 of 64 requests failed"


def add_run_with_invalid_level(url: str, engine: str = "vllm", concurrency: int = 32) -> int:
    """The newest run of ``engine`` (last commit, day 5) whose level ``concurrency`` is stored invalid,
    with token gaps twice as long there, so a wrong frontier through it would show."""
    store = Store.open(url)
    try:
        run_id = store.create_run(meta(engine, COMMITS[-1], "main", T0 + timedelta(days=5)))
        for c in LEVELS:
            gap = gap_ms(engine, c, len(COMMITS) - 1) * (2.0 if c == concurrency else 1.0)
            recs = level_records(c, ttft_ms(c), gap)
            point = summarize_level(recs, concurrency=c, num_gpus=1)
            if c == concurrency:
                point["valid"], point["invalid_reason"] = False, INVALID_REASON
            store.add_point(run_id, point, recs)
        store.finish_run(run_id, "complete")
    finally:
        store.close()
    return run_id
