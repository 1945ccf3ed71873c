#!/usr/bin/env bash
# The trusted half of the PR gate (ci/github/pr_comment.yml calls it after each PR benchmark run):
# checks the verdict the untrusted PR job uploaded, posts it as the PR's ONE k2bench comment
# (ci/pr_comment.sh) and removes the "benchmark" label, so that the next commit needs a new approval.
# The verdict folder is data from the PR's own code: nothing in it is executed or sourced; only
# comment.md (at most 60,000 bytes of UTF-8 text starting with the k2bench marker) and verdict.json
# (at most 1,024 bytes: {"pr": N, "head_sha": SHA}) are accepted, and SHA and PR N must be the commit
# and the pull request of the workflow run that GitHub reports (RUN_HEAD_*), not what the artifact says.
#
# usage: ci/pr_verdict_comment.sh VERDICT_DIR
# environment: GITHUB_REPOSITORY, GH_TOKEN (may write PR comments and labels), RUN_HEAD_SHA,
#              RUN_HEAD_REPO (owner/name of the PR's head repository), RUN_HEAD_BRANCH, RUN_URL,
#              RUN_CONCLUSION, K2BENCH_LABEL (default benchmark), K2BENCH_COMMENT_AUTHOR (ci/pr_comment.sh)
set -euo pipefail
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then sed -n '2,13p' "$0"; exit 0; fi
case "${1:-}" in -*) echo "ci/pr_verdict_comment.sh: unknown argument $1" >&2; exit 2 ;; esac
if [ $# -ne 1 ]; then echo "usage: ci/pr_verdict_comment.sh VERDICT_DIR" >&2; exit 2; fi
DIR=$1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SLUG=${GITHUB_REPOSITORY:?GITHUB_REPOSITORY (owner/name) is needed}
LABEL=${K2BENCH_LABEL:-benchmark}
[[ "$LABEL" =~ ^[A-Za-z0-9._-]+$ ]] || { echo "ci/pr_verdict_comment.sh: K2BENCH_LABEL '$LABEL' is not a plain label name" >&2; exit 2; }
MARKER='<!-- k2bench-regress -->'
MAX_COMMENT=60000
MAX_VERDICT=1024

refuse() { echo "ci/pr_verdict_comment.sh: refusing the artifact: $*" >&2; exit 3; }

[[ "${RUN_HEAD_SHA:-}" =~ ^[0-9a-f]{40}$ ]] || { echo "ci/pr_verdict_comment.sh: RUN_HEAD_SHA must be a commit SHA" >&2; exit 2; }
if [ ! -d "$DIR" ] || [ -L "$DIR" ]; then
  echo "ci/pr_verdict_comment.sh: no verdict folder $DIR (the PR job stopped before writing one); nothing to post"
  exit 0
fi
# Only the two expected names, as plain files (no links, folders or anything else).
while IFS= read -r -d '' entry; do
  name=${entry#"$DIR"/}
  case "$name" in
    comment.md|verdict.json) [ -f "$entry" ] && [ ! -L "$entry" ] || refuse "$name is not a plain file" ;;
    *) refuse "unexpected entry $(printf '%q' "$name")" ;;
  esac
done < <(find "$DIR" -mindepth 1 -print0)

V=$DIR/verdict.json
[ -f "$V" ] || refuse "verdict.json is missing"
[ "$(stat -c %s "$V")" -le "$MAX_VERDICT" ] || refuse "verdict.json is larger than $MAX_VERDICT bytes"
PR=$(jq -er 'if (.pr | type) == "number" and .pr >= 1 and .pr < 10000000000 and .pr == (.pr | floor)
             then .pr else error("pr") end' "$V" 2>/dev/null) || refuse "verdict.json has no valid pr number"
SHA=$(jq -er '.head_sha | strings' "$V" 2>/dev/null) || refuse "verdict.json has no head_sha"
[ "$SHA" = "$RUN_HEAD_SHA" ] || refuse "verdict.json names commit ${SHA:0:40}, the workflow run benchmarked $RUN_HEAD_SHA"
# The PR number is the artifact's word: GitHub must confirm that PR's head is the run's repository and branch.
PR_HEAD=$(gh api "repos/$SLUG/pulls/$PR" --jq '.head.repo.full_name + ":" + .head.ref') \
  || refuse "pull request #$PR cannot be read"
[ "$PR_HEAD" = "${RUN_HEAD_REPO:-}:${RUN_HEAD_BRANCH:-}" ] \
  || refuse "pull request #$PR comes from $PR_HEAD, the workflow run from ${RUN_HEAD_REPO:-?}:${RUN_HEAD_BRANCH:-?}"

BODY=$(mktemp "${RUNNER_TEMP:-${TMPDIR:-/tmp}}/k2bench-comment.XXXXXX")
trap 'rm -f "$BODY"' EXIT
C=$DIR/comment.md
FOOTER="_k2bench: commit \`$RUN_HEAD_SHA\`, workflow run ${RUN_URL:-?} (${RUN_CONCLUSION:-?}). The report above was produced by the pull request's own code._"
if [ -f "$C" ]; then
  [ "$(stat -c %s "$C")" -le "$MAX_COMMENT" ] || refuse "comment.md is larger than $MAX_COMMENT bytes"
  iconv -f UTF-8 -t UTF-8 "$C" >/dev/null 2>&1 || refuse "comment.md is not UTF-8 text"
  [ "$(tr -d '\000' <"$C" | wc -c)" = "$(stat -c %s "$C")" ] || refuse "comment.md contains NUL bytes"
  [ "$(head -c ${#MARKER} "$C")" = "$MARKER" ] || refuse "comment.md does not start with $MARKER"
  { cat "$C"; printf '\n\n---\n%s\n' "$FOOTER"; } >"$BODY"
else
  { echo "$MARKER"; echo "**k2bench**: the benchmark run ended without a report (see its log)."; echo
    echo "$FOOTER"; } >"$BODY"
fi
bash "$HERE/pr_comment.sh" "$BODY" "$PR"
# The approval was for this commit only: take the label off so that a new push needs a new one.
gh api -X DELETE "repos/$SLUG/issues/$PR/labels/$LABEL" >/dev/null 2>&1 \
  && echo "k2bench: removed the '$LABEL' label from #$PR" \
  || echo "k2bench: the '$LABEL' label was not on #$PR"
