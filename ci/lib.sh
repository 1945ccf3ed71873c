#!/usr/bin/env bash
# Setup shared by ci/pr.sh and ci/nightly.sh; they source this file after parsing their arguments.
# Not a command of its own.

# k2_paths: make REPO and OUT absolute (creating OUT), then set DB (K2BENCH_DB, else SQLite in OUT)
# and SHOWN_DB, what may be printed of it: a URL from K2BENCH_DB is a secret in CI.
k2_paths() {
  REPO=$(cd "$REPO" && pwd)
  mkdir -p "$OUT"
  OUT=$(cd "$OUT" && pwd)
  DB=${K2BENCH_DB:-sqlite:///$OUT/k2bench.db}
  if [ -n "${K2BENCH_DB:-}" ]; then SHOWN_DB="(secret URL from K2BENCH_DB)"; else SHOWN_DB=$DB; fi
}

# k2_sweep WHO DIR COMMIT BRANCH [ARG...]: run one sweep inside the checkout DIR:
#   $K2BENCH_SWEEP_CMD (default "k2bench sweep") $K2BENCH_SWEEP_ARGS --commit C --branch B --db $DB ARG...
# A sweep whose levels were all measured goes on even when some level is invalid (its exit 1): the
# gate reports such a level as `invalid`. Any other exit (2 bad input, 3 server, 70 a crash in k2bench,
# 130 interrupted) exits the script with 3 (never 1: to the PR gate 1 means a regression).
k2_sweep() {
  local who=$1 dir=$2 commit=$3 branch=$4 rc=0
  shift 4
  (cd "$dir" && bash -c "${K2BENCH_SWEEP_CMD:-k2bench sweep} ${K2BENCH_SWEEP_ARGS:-} \"\$@\"" sweep \
    --commit "$commit" --branch "$branch" --db "$DB" "$@") || rc=$?
  if [ "$rc" = 1 ]; then
    echo "$who: the sweep of ${commit:0:10} stored an invalid level; the gate reports it as invalid" >&2
  elif [ "$rc" != 0 ]; then
    echo "$who: the sweep of ${commit:0:10} failed (exit $rc)" >&2
    exit 3
  fi
}

# k2_nightly_args "$@": the arguments both nightly scripts take; sets REPO, BRANCH, OUT.
# --help prints the calling script's header comment (lines 2-13).
k2_nightly_args() {
  REPO=.
  BRANCH=main
  OUT=${K2BENCH_OUT:-results/nightly}
  while [ $# -gt 0 ]; do
    case "$1" in
      --repo) REPO=$2; shift 2 ;;
      --branch) BRANCH=$2; shift 2 ;;
      --out) OUT=$2; shift 2 ;;
      -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;  # the script's header comment
      *) echo "$(basename "$0"): unknown argument $1" >&2; exit 2 ;;
    esac
  done
}
