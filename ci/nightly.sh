#!/usr/bin/env bash
# Nightly job, runnable anywhere (GitHub Actions calls it from ci/github/nightly.yml):
#   1. sweep the checked-out commit of the default branch (run JSON kept in <out>);
#   2. k2bench changepoints over the branch history (listed, and stored for the dashboard);
#   3. a report of tonight's run against the latest earlier runs of the branch (never fails the job).
# Results go to K2BENCH_DB (a secret URL in CI, e.g. postgresql://...); without it they stay in
# sqlite:///<out>/k2bench.db, which the workflow keeps as an artifact.
#
# usage: ci/nightly.sh [--repo DIR] [--branch main] [--out DIR]
# environment: K2BENCH_DB, K2BENCH_SWEEP_CMD (default "k2bench sweep"), K2BENCH_SWEEP_ARGS,
#              K2BENCH_CHANGEPOINT_ARGS (e.g. "--window 50 --gate-metric +steady_tput_per_gpu"),
#              K2BENCH_REGRESS_ARGS (the report's, e.g. "--gate-metric +steady_tput_per_gpu")
set -euo pipefail

# shellcheck source=ci/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
k2_nightly_args "$@"
k2_paths
SHA=$(git -C "$REPO" rev-parse HEAD)
echo "k2bench nightly: ${SHA:0:10} on $BRANCH, db $SHOWN_DB"

k2_sweep "k2bench nightly" "$REPO" "$SHA" "$BRANCH" --json "$OUT/run-${SHA:0:10}.json"

# shellcheck disable=SC2086
k2bench changepoints --branch "$BRANCH" --db "$DB" ${K2BENCH_CHANGEPOINT_ARGS:-} | tee "$OUT/changepoints.txt"

# shellcheck disable=SC2086
k2bench regress --candidate "$SHA" --baseline-mode latest --default-branch "$BRANCH" --db "$DB" \
  --out "$OUT/nightly.md" ${K2BENCH_REGRESS_ARGS:-} || echo "k2bench nightly: no report (see above)"
