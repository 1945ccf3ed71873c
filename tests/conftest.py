"""Shared fixtures. Tests mirror the code folders: tests/harness, tests/engine, tests/analysis, tests/dashboard."""

from __future__ import annotations

import socket

import pytest


def free_port() -> int:
    """Ask the OS for a free TCP port on loopback (no hard-coded ports in tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()
