#!/usr/bin/env bash
# Create or update the ONE k2bench comment of a PR with gh: the comment is found by the hidden
# marker that `k2bench regress` puts on its first line, so a new push edits it instead of adding one.
#
# usage: ci/pr_comment.sh COMMENT.md PR_NUMBER
# environment: GITHUB_REPOSITORY (owner/name), GH_TOKEN (a token that may write PR comments)
set -euo pipefail
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then sed -n '2,7p' "$0"; exit 0; fi
if [ $# -ne 2 ]; then echo "usage: ci/pr_comment.sh COMMENT.md PR_NUMBER" >&2; exit 2; fi
BODY=$1
PR=$2
MARKER='<!-- k2bench-regress -->'
SLUG=${GITHUB_REPOSITORY:?GITHUB_REPOSITORY (owner/name) is needed to comment}
if ! head -n 1 "$BODY" | grep -qF "$MARKER"; then
  echo "ci/pr_comment.sh: $BODY does not start with $MARKER; refusing (it could never be found again)" >&2
  exit 2
fi
# sed, not head: head would quit after one line and, under pipefail, a gh still writing further
# pages would die of SIGPIPE and take the script down with it
ID=$(gh api "repos/$SLUG/issues/$PR/comments" --paginate \
      --jq ".[] | select(.body | contains(\"$MARKER\")) | .id" | sed -n 1p)
if [ -n "$ID" ]; then
  gh api -X PATCH "repos/$SLUG/issues/comments/$ID" -F "body=@$BODY" >/dev/null
  echo "k2bench: updated comment $ID on #$PR"
else
  gh api -X POST "repos/$SLUG/issues/$PR/comments" -F "body=@$BODY" >/dev/null
  echo "k2bench: commented on #$PR"
fi
