"""Shared fixtures. Tests mirror the code folders: tests/harness, tests/workloads, tests/engine, tests/analysis,
tests/dashboard; tests/test_import_boundaries.py guards the folders' import rules.

`free_port` is k2bench.net's (imported here for the fixture; tests import it from k2bench.net)."""

from __future__ import annotations

import pytest

from k2bench.net import free_port


@pytest.fixture
def port() -> int:
    """A free loopback port (no hard-coded ports in tests)."""
    return free_port()
