#!/usr/bin/env bash
# PR gate, runnable anywhere (GitHub Actions calls it from ci/github/pr.yml, in the untrusted job):
#   0. with --baseline-dir, import the base branch's runs exported there (ci/pr_baseline.sh);
#   1. sweep the checked-out PR head;
#   2. make sure its merge-base with the default branch has a comparable run (sweep it in a
#      temporary git worktree when it has none);
#   3. k2bench regress against that baseline -> comment.md (+ comment.png) and regress.json;
#   4. create or update ONE PR comment (ci/pr_comment.sh, with gh), when a PR is given (the workflow
#      leaves this to its separate commenter, ci/github/pr_comment.yml);
#   5. exit 1 on a regression, 0 otherwise; 2 usage, 3 a failed sweep or server, 4 a failed comment.
#
# usage: ci/pr.sh [--repo DIR] [--base BRANCH] [--out DIR] [--pr NUMBER] [--baseline-dir DIR]
# environment (all optional):
#   K2BENCH_DB            database URL; default sqlite:///<out>/k2bench.db (then keep <out> as an artifact);
#                         never the shared history's URL for a PR's code (docs/ci.md, "Trust model")
#   K2BENCH_SWEEP_CMD     how to run one sweep from a checkout (default "k2bench sweep"); it is run inside
#                         the checkout with "$K2BENCH_SWEEP_ARGS --commit SHA --branch NAME --db URL" appended
#   K2BENCH_SWEEP_ARGS    e.g. "--engine vllm --model /models/x --tp 4 --conc 4..64"
#   K2BENCH_BASELINE_SWEEP  auto (sweep the merge-base only when it has no comparable run), always, never
#   K2BENCH_REGRESS_ARGS  extra arguments for k2bench regress, e.g. "--threshold 3% --threshold ttft_ms_p99=10%"
#                         or "--gate-metric +steady_tput_per_gpu" (which metrics are judged)
#   K2BENCH_HEAD_BRANCH   branch name to record for the head (default: current branch, else pr-<N>)
#   PR_NUMBER, GITHUB_REPOSITORY, GH_TOKEN   where to comment; K2BENCH_NO_COMMENT=1 to skip commenting
set -euo pipefail

REPO=.
BASE=${K2BENCH_BASE_BRANCH:-main}
OUT=${K2BENCH_OUT:-results/pr}
PR=${PR_NUMBER:-}
BASELINE_DIR=
while [ $# -gt 0 ]; do
  case "$1" in
    --repo) REPO=$2; shift 2 ;;
    --base) BASE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --pr) PR=$2; shift 2 ;;
    --baseline-dir) BASELINE_DIR=$2; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "ci/pr.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

# shellcheck source=ci/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
k2_paths
BASELINE_SWEEP=${K2BENCH_BASELINE_SWEEP:-auto}
case "$BASELINE_SWEEP" in
  auto|always|never) ;;
  *) echo "ci/pr.sh: K2BENCH_BASELINE_SWEEP must be auto, always or never, not '$BASELINE_SWEEP'" >&2; exit 2 ;;
esac

HEAD_SHA=$(git -C "$REPO" rev-parse HEAD)
HEAD_BRANCH=${K2BENCH_HEAD_BRANCH:-$(git -C "$REPO" rev-parse --abbrev-ref HEAD)}
if [ "$HEAD_BRANCH" = HEAD ]; then HEAD_BRANCH="pr-${PR:-local}"; fi
MB=$(git -C "$REPO" merge-base "$BASE" HEAD 2>/dev/null || git -C "$REPO" merge-base "origin/$BASE" HEAD 2>/dev/null || true)
echo "k2bench PR gate: head ${HEAD_SHA:0:10} ($HEAD_BRANCH), base $BASE, merge-base ${MB:0:10}, db $SHOWN_DB"

has_merge_base_run() {  # is there a run at the merge-base comparable with the head's runs?
  python - "$DB" "$HEAD_SHA" "$REPO" "$BASE" <<'PY'
import sys
from k2bench.harness.analysis import baseline as bl
from k2bench.harness.store import Store
db, head, repo, base = sys.argv[1:]
store = Store.open(db, readonly=True)
cand = bl.resolve_runs(store, head, repo)
sel = bl.select(store, cand, "auto", bl.BaselineOptions(mode="merge-base", default_branch=base, repo=repo))
sys.exit(0 if sel.baseline else 1)
PY
}

if [ -n "$BASELINE_DIR" ]; then
  shopt -s nullglob
  exported=("$BASELINE_DIR"/*.json)
  shopt -u nullglob
  if [ ${#exported[@]} -gt 0 ]; then
    k2bench import --db "$DB" "${exported[@]}" >/dev/null || {
      echo "k2bench PR gate: could not import the base branch's runs from $BASELINE_DIR" >&2
      exit 3
    }
    echo "k2bench PR gate: imported ${#exported[@]} run(s) of the base branch from $BASELINE_DIR"
  else
    echo "k2bench PR gate: no exported runs in $BASELINE_DIR"
  fi
fi

k2_sweep "k2bench PR gate" "$REPO" "$HEAD_SHA" "$HEAD_BRANCH"

if [ -n "$MB" ] && [ "$MB" != "$HEAD_SHA" ] && [ "$BASELINE_SWEEP" != never ]; then
  if [ "$BASELINE_SWEEP" = always ] || ! has_merge_base_run; then
    WT=$(mktemp -d "${TMPDIR:-/tmp}/k2bench-base.XXXXXX")
    trap 'git -C "$REPO" worktree remove --force "$WT" >/dev/null 2>&1 || true; rm -rf "$WT"' EXIT
    git -C "$REPO" worktree add --detach --force "$WT" "$MB" >/dev/null
    echo "k2bench PR gate: sweeping the merge-base ${MB:0:10} in $WT"
    k2_sweep "k2bench PR gate" "$WT" "$MB" "$BASE"
  fi
fi

rc=0
# shellcheck disable=SC2086  # K2BENCH_REGRESS_ARGS is a list of words on purpose
k2bench regress --candidate "$HEAD_SHA" --repo "$REPO" --default-branch "$BASE" --db "$DB" \
  --out "$OUT/comment.md" --json "$OUT/regress.json" --fail-on-regression ${K2BENCH_REGRESS_ARGS:-} || rc=$?
if [ "$rc" -gt 1 ]; then exit "$rc"; fi

# A PR comment cannot show a file from the runner: point at the artifact instead of a broken image.
sed -i 's|^!\[frontiers\](\(.*\))$|_Frontier plot: `\1` in this run'"'"'s workflow artifacts._|' "$OUT/comment.md"

if [ -n "$PR" ] && [ -z "${K2BENCH_NO_COMMENT:-}" ] && command -v gh >/dev/null 2>&1; then
  bash "$(dirname "$0")/pr_comment.sh" "$OUT/comment.md" "$PR" || {
    echo "k2bench PR gate: could not post the comment" >&2
    exit 4
  }
else
  echo "k2bench PR gate: no PR comment (PR number, gh or K2BENCH_NO_COMMENT); the comment is in $OUT/comment.md"
fi
echo "k2bench PR gate: exit $rc ($([ "$rc" = 1 ] && echo regression || echo no regression))"
exit "$rc"
