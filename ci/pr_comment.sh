#!/usr/bin/env bash
# Create or update the ONE k2bench comment of a PR with gh. The comment to update is the first one that
# this script's own bot identity wrote (author login K2BENCH_COMMENT_AUTHOR) AND that carries the hidden
# marker `k2bench regress` puts on its first line: a comment by anyone else that quotes the marker is
# never edited (nor could it be: only its author may edit a comment).
#
# usage: ci/pr_comment.sh COMMENT.md PR_NUMBER
# environment: GITHUB_REPOSITORY (owner/name), GH_TOKEN (a token that may write PR comments),
#              K2BENCH_COMMENT_AUTHOR (the login GH_TOKEN posts as; default github-actions[bot])
set -euo pipefail
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then sed -n '2,9p' "$0"; exit 0; fi
if [ $# -ne 2 ]; then echo "usage: ci/pr_comment.sh COMMENT.md PR_NUMBER" >&2; exit 2; fi
BODY=$1
PR=$2
MARKER='<!-- k2bench-regress -->'
AUTHOR=${K2BENCH_COMMENT_AUTHOR:-github-actions[bot]}
SLUG=${GITHUB_REPOSITORY:?GITHUB_REPOSITORY (owner/name) is needed to comment}
if ! [[ "$PR" =~ ^[1-9][0-9]{0,9}$ ]]; then
  echo "ci/pr_comment.sh: PR_NUMBER must be a positive integer, not '$PR'" >&2
  exit 2
fi
# The login goes into a jq filter: allow only what GitHub allows in a login (plus a bot's [bot] suffix).
if ! [[ "$AUTHOR" =~ ^[A-Za-z0-9][A-Za-z0-9-]{0,38}(\[bot\])?$ ]]; then
  echo "ci/pr_comment.sh: K2BENCH_COMMENT_AUTHOR '$AUTHOR' is not a GitHub login" >&2
  exit 2
fi
if ! head -n 1 "$BODY" | grep -qF "$MARKER"; then
  echo "ci/pr_comment.sh: $BODY does not start with $MARKER; refusing (it could never be found again)" >&2
  exit 2
fi
# sed, not head: head would quit after one line and, under pipefail, a gh still writing further
# pages would die of SIGPIPE and take the script down with it
ID=$(gh api "repos/$SLUG/issues/$PR/comments" --paginate \
      --jq ".[] | select(.user.login == \"$AUTHOR\" and (.body | startswith(\"$MARKER\"))) | .id" | sed -n 1p)
if [ -n "$ID" ]; then
  gh api -X PATCH "repos/$SLUG/issues/comments/$ID" -F "body=@$BODY" >/dev/null
  echo "k2bench: updated comment $ID on #$PR"
else
  gh api -X POST "repos/$SLUG/issues/$PR/comments" -F "body=@$BODY" >/dev/null
  echo "k2bench: commented on #$PR"
fi
