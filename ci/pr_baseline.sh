#!/usr/bin/env bash
# The trusted half of the PR gate's baseline (ci/github/pr.yml's baseline job, which never runs the
# PR's code): export the base branch's newest stored runs from the shared history as k2bench.run JSON
# files, for the untrusted PR job to import into its private SQLite database. It only reads: give it a
# read-only database role (K2BENCH_DB_READ_URL in the workflow), and the store is opened read-only.
# Without K2BENCH_DB (e.g. a fork's PR, which GitHub gives no secrets) nothing is exported and the PR
# job sweeps the merge-base itself.
#
# usage: ci/pr_baseline.sh [--branch main] [--out DIR] [--limit N]
# environment: K2BENCH_DB (read-only URL), K2BENCH_BASELINE_RUNS (default for --limit; 200)
set -euo pipefail
BRANCH=main
OUT=results/baseline
LIMIT=${K2BENCH_BASELINE_RUNS:-200}
while [ $# -gt 0 ]; do
  case "$1" in
    --branch) BRANCH=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "ci/pr_baseline.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if ! [[ "$LIMIT" =~ ^[1-9][0-9]*$ ]]; then
  echo "ci/pr_baseline.sh: the run limit must be a positive integer, not '$LIMIT'" >&2
  exit 2
fi
mkdir -p "$OUT"
if [ -z "${K2BENCH_DB:-}" ]; then
  echo "k2bench PR baseline: no K2BENCH_DB; no runs exported (the PR job sweeps the merge-base itself)"
  exit 0
fi
python - "$BRANCH" "$OUT" "$LIMIT" <<'PY'
import os
import sys
from pathlib import Path

from k2bench.harness.record.runjson import write_doc
from k2bench.harness.store import Store

branch, out, limit = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
with Store.open(os.environ["K2BENCH_DB"], readonly=True) as store:
    runs = store.list_runs(branch=branch, limit=limit)
    for run in runs:
        write_doc(store.export_run(run["id"]), out / f"run-{run['id']}.json")
print(f"k2bench PR baseline: exported {len(runs)} run(s) of {branch} (newest first, at most {limit})")
PY
