"""k2bench.aio: the client and `k2bench serve` run on uvloop where installed, asyncio's loop on request."""

from __future__ import annotations

import asyncio

import pytest

from k2bench import aio


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_by_default_and_asyncio_on_request(monkeypatch):
    pytest.importorskip("uvloop")
    monkeypatch.delenv(aio.NO_UVLOOP_ENV, raising=False)
    assert aio.event_loop_name() == "uvloop"
    assert aio.run(_loop_module()).startswith("uvloop")
    monkeypatch.setenv(aio.NO_UVLOOP_ENV, "1")
    assert aio.event_loop_name() == "asyncio"
    assert aio.run(_loop_module()).startswith("asyncio")
