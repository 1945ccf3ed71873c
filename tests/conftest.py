"""Shared fixtures. Tests mirror the code folders: tests/harness, tests/workloads, tests/engine, tests/analysis,
tests/dashboard; tests/test_import_boundaries.py guards the folders' import rules.

`free_port` is k2bench.net's (imported here for the fixture; tests import it from k2bench.net)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from k2bench.net import free_port

# One cache of generated and trained models for every test and the processes they start (the default
# sweep, the README's quick start, the accuracy tests): the trained tiny model is keyed by its trainer's
# version and settings, so the suite trains it at most once, and not at all when this checkout has it.
os.environ.setdefault("K2BENCH_MODELS", str(Path(__file__).resolve().parents[1] / "results" / "models"))


@pytest.fixture
def port() -> int:
    """A free loopback port (no hard-coded ports in tests)."""
    return free_port()
