#!/usr/bin/env bash
# The project's test command (README: "pass the tests"). Assumes the package is installed.
# Two pytest workers (pytest-xdist), one test file at a time each: the 2-core CI machine spends much
# of the suite waiting on servers and child processes. A file's module-scoped fixtures (an interpreted
# kernel run, a server, a trained model) stay in one worker; the tiny model's cache is locked.
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check .
# The workflow templates' security audit, offline (CI cannot reach GitHub): any high finding fails.
zizmor --offline --no-progress --min-severity high ci/github/*.yml
python -m pytest -q -n 2 --dist loadfile "$@"
