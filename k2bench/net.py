"""Network helpers shared by the harness, the engine, the tests and the bench scripts."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS says is free on `host` now (never a hard-coded port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def normalize_base_url(url: str) -> str:
    """Accept ``http://h:p``, ``http://h:p/`` or ``http://h:p/v1``; return the server root."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url
