#!/usr/bin/env bash
# A profiled level of the bundled engine at Kimi-K2.5 width on one GPU, in one device call (~3 min):
# a sweep with --profile-level (torch.profiler inside `k2bench serve`, CUDA kernels timed on the
# device), then the kernel-time summary as a table; with REPEAT=1 a second identical sweep and
# `k2bench profile-diff` between the two, which shows the diff's noise floor on an unchanged build.
#   OUT=/tmp/out LAYERS=2 CONC=16 REQUESTS=16 ISL=1024 OSL=128 [REPEAT=1] bash bench/gpu_profile.sh
# Writes under $OUT: run.log, sweep.json (the run, its profile summary included), summary.json,
# summary_top.txt, trace.json.gz (when under 200 MB), and with REPEAT=1 sweep2.json and profile_diff.txt.
set -uo pipefail
OUT=${OUT:-/tmp/k2bench-profile}
LAYERS=${LAYERS:-2}
CONC=${CONC:-16}
REQUESTS=${REQUESTS:-16}
ISL=${ISL:-1024}
OSL=${OSL:-128}
WORK=$(mktemp -d)
DB="sqlite:///$WORK/k2bench.db"
. bench/gpu_setup.sh

width_checkpoint "$LAYERS"

sweep() {  # $1: the JSON to write
  (cd "$WORK" && CUDA_VISIBLE_DEVICES=0 timeout --signal=TERM --kill-after=20 300 k2bench sweep --engine bundled \
    --model "$CKPT" --tp 1 --isl "$ISL" --osl "$OSL" --conc "$CONC" --num-prompts 2x --warmup 1x \
    --profile-level "$CONC:$REQUESTS" --no-telemetry --db "$DB" --json "$1") 2>&1 | tail -12 | tee -a "$OUT/run.log"
}

log "sweep: conc $CONC, ISL $ISL, OSL $OSL, profiling $REQUESTS requests after the level"
sweep "$OUT/sweep.json"

[ -f "$OUT/sweep.json" ] && python3 - "$OUT" <<'PY' | tee "$OUT/summary_top.txt" | tee -a "$OUT/run.log"
import gzip, json, os, shutil, sys
out = sys.argv[1]
prof = json.load(open(os.path.join(out, "sweep.json")))["run"].get("profile") or {}
if not prof.get("summary"):
    sys.exit(f"no profile summary: {prof.get('error') or prof}")
s = prof["summary"]
json.dump(s, open(os.path.join(out, "summary.json"), "w"), indent=1)
trace = prof.get("trace")
if trace and os.path.getsize(trace) < 200 << 20:
    with open(trace, "rb") as src, gzip.open(os.path.join(out, "trace.json.gz"), "wb") as dst:
        shutil.copyfileobj(src, dst)
print(f"device {s['device']}, {s['steps']} engine steps in {s['window_s']:.2f} s, {s['ops_total']} ops/kernels, "
      f"{prof['completed']}/{prof['requests']} requests at concurrency {prof['concurrency']}")
for kind in ("cuda", "cpu"):
    rows = [o for o in s["ops"] if o["kind"] == kind][:20]
    total = max(sum(o["self_us"] for o in s["ops"] if o["kind"] == kind), 1e-9)
    print(f"\n{kind}: self time per engine step, top 20 (all listed {kind} entries: "
          f"{total / max(s['steps'], 1):,.0f} us/step)")
    print(f"{'us/step':>10} {'share':>6} {'calls/step':>10}  name")
    for o in rows:
        print(f"{o['self_us_per_step']:>10,.1f} {o['self_us'] / total:>6.1%} {o['calls'] / max(s['steps'], 1):>10.2f}  "
              f"{o['name'][:110]}")
PY

if [ "${REPEAT:-0}" = 1 ]; then
  log "the same sweep again, then profile-diff between the two (the noise floor of the diff)"
  sweep "$OUT/sweep2.json"
  k2bench profile-diff 1 2 --db "$DB" --top 20 2>&1 | tee "$OUT/profile_diff.txt" | tee -a "$OUT/run.log"
fi
log "done"
