#!/usr/bin/env bash
# The nightly fan-in, after every suite job has stored its run (ci/github/nightly.yml calls it):
#   1. k2bench changepoints over the branch history (listed, and stored for the dashboard);
#   2. k2bench bisect --shifts: every stored shift between two stored commits that are not adjacent
#      is bisected to its first bad commit (reports and culprits.md in <out>/bisect);
#   3. when a culprit came in through a pull request, a comment on that PR names it.
# Bisecting needs K2BENCH_BISECT_SERVER_CMD (the server command run from each commit's worktree);
# without it the shifts are listed and not bisected. With K2BENCH_BISECT_PROFILE=C:N (N requests; C
# is replaced by each shift's own concurrency) both commits around each culprit are profiled: the
# kernel-time diff goes into culprits.md and the PR comment, traces and server logs into <out>/logs.
#
# usage: ci/nightly_scan.sh [--repo DIR] [--branch main] [--out DIR]
# environment: K2BENCH_DB, K2BENCH_CHANGEPOINT_ARGS (e.g. "--gate-metric +steady_tput_per_gpu"; a shift in a
#              metric scanned this way is bisected on that metric), K2BENCH_BISECT_SERVER_CMD, K2BENCH_BISECT_SETUP,
#              K2BENCH_BISECT_ARGS (e.g. "--num-prompts 40 --trials 2"), K2BENCH_BISECT_PROFILE (e.g. 4:8),
#              GH_TOKEN + GITHUB_REPOSITORY
set -euo pipefail

# shellcheck source=ci/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
k2_nightly_args "$@"
k2_paths
echo "k2bench nightly scan: $BRANCH, db $SHOWN_DB"

# shellcheck disable=SC2086
k2bench changepoints --branch "$BRANCH" --db "$DB" ${K2BENCH_CHANGEPOINT_ARGS:-} | tee "$OUT/changepoints.txt"

if [ -z "${K2BENCH_BISECT_SERVER_CMD:-}" ]; then
  echo "k2bench nightly scan: K2BENCH_BISECT_SERVER_CMD is not set; shifts are not bisected"
  exit 0
fi
SETUP=()
if [ -n "${K2BENCH_BISECT_SETUP:-}" ]; then SETUP=(--setup "$K2BENCH_BISECT_SETUP"); fi
PROFILE=()
if [ -n "${K2BENCH_BISECT_PROFILE:-}" ]; then
  PROFILE=(--profile-level "$K2BENCH_BISECT_PROFILE" --conc "${K2BENCH_BISECT_PROFILE%%:*}" --log-dir "$OUT/logs")
fi
# shellcheck disable=SC2086
k2bench bisect --shifts "$BRANCH" --repo "$REPO" --server-cmd "$K2BENCH_BISECT_SERVER_CMD" "${SETUP[@]}" \
  "${PROFILE[@]}" --db "$DB" --out-dir "$OUT/bisect" ${K2BENCH_BISECT_ARGS:-} \
  || echo "k2bench nightly scan: bisect failed (see above)"

if [ -z "${GITHUB_REPOSITORY:-}" ] || ! command -v gh >/dev/null; then exit 0; fi
for report in "$OUT"/bisect/bisect-*.json; do
  [ -e "$report" ] || continue
  SHA=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["first_bad"] or "")' "$report")
  [ -n "$SHA" ] || continue
  PR=$(gh api "repos/$GITHUB_REPOSITORY/commits/$SHA/pulls" --jq '.[0].number // empty' 2>/dev/null || true)
  [ -n "$PR" ] || continue
  BODY="$OUT/bisect/comment-${SHA:0:12}.md"
  {
    echo "**k2bench nightly**: bisection names commit $SHA of this pull request as the first one where"
    echo "$(basename "$report" .json | cut -d- -f3-) got worse. Steps (commit, value, verdict):"
    echo
    python3 - "$report" <<'PY'
import json
import sys

from k2bench.harness.analysis.mdsafe import md_code

doc = json.load(open(sys.argv[1]))
for s in doc["steps"]:
    print("- {}  {}  {}".format(s["commit"][:12], s["value"], s["verdict"]))
diff = (doc.get("profiles") or {}).get("diff") or []
if diff:  # names come from the server's profiler: inert code spans
    print("\nSelf time per engine step that changed most (last good -> first bad, µs):\n")
    for d in diff[:5]:
        print("- {}: {:,.1f} -> {:,.1f}".format(md_code(d["name"]), d["last good_us_per_step"],
                                                d["first bad_us_per_step"]))
PY
  } >"$BODY"
  gh api -X POST "repos/$GITHUB_REPOSITORY/issues/$PR/comments" -F "body=@$BODY" >/dev/null \
    && echo "k2bench nightly scan: commented on #$PR" || echo "k2bench nightly scan: could not comment on #$PR"
done
