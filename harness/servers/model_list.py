"""What a server says it serves: the entries of its OpenAI ``/v1/models`` list.

Asked once per sweep, before any load, so a plain blocking request does; the load generator's
event loop is not needed for it (and the launcher does not depend on the load generator).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request

from k2bench.errors import ServerError
from k2bench.harness import redact
from k2bench.net import normalize_base_url


def served_models(base_url: str, timeout_s: float = 10.0, api_key: str | None = None) -> list[dict]:
    """The entries of the server's ``/v1/models`` (each has an ``id``; vLLM's also the model's ``root``)."""
    root = normalize_base_url(base_url)
    url, headers = _without_userinfo(root + "/v1/models", api_key)
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            text = resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", errors="replace").strip()[:300]
        raise ServerError(f"{redact.text(root)}/v1/models answered HTTP {exc.code}: {body}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServerError(f"cannot reach the server at {redact.text(root)}: {redact.text(str(reason))}") from None
    try:
        models = [m for m in json.loads(text).get("data", []) if isinstance(m["id"], str)]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ServerError(f"{redact.text(root)}/v1/models did not return an OpenAI model list: {text[:200]}") from None
    return models


def _without_userinfo(url: str, api_key: str | None) -> tuple[str, dict[str, str]]:
    """urllib reads ``user:pass@`` as part of the host name; send it as HTTP basic auth instead (as
    aiohttp, which the load generator uses, does), unless an API key is given."""
    parts = urllib.parse.urlsplit(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if parts.username is None:
        return url, headers
    if not api_key:
        pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        headers = {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode("ascii")}
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=host)), headers
