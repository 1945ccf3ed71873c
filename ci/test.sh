#!/usr/bin/env bash
# The project's test command (README: "pass the tests"). Assumes the package is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check .
python -m pytest -q "$@"
