"""`k2bench serve --enable-prefix-caching`: cached_tokens in the usage and the prefix-cache counters on
/metrics equal what the prompts imply; a set of prompts half made of one shared prefix gets a hit
rate of one half with caching on and none with it off (the figure wload6's hit-rate metric reads)."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_runtime_server import Server

pytestmark = [pytest.mark.engine, pytest.mark.slow]

BLOCK = 16  # Server's --block-size
P = "k2bench_prefix_cache_"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from k2bench.engine.model.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("pcs") / "tiny", quant="mxfp4")


def half_shared(n: int, prefix_len: int, seed: int) -> list[list[int]]:
    """n prompts of 2 x prefix_len tokens: one shared prefix, then a unique half."""
    rng = random.Random(seed)
    prefix = [rng.randrange(10, 500) for _ in range(prefix_len)]
    return [prefix + [rng.randrange(10, 500) for _ in range(prefix_len)] for _ in range(n)]


def complete(server: Server, prompt: list[int], stream: bool) -> tuple[int, list[int]]:
    """(usage.prompt_tokens_details.cached_tokens, greedy token ids) of one request."""
    c = server.client()
    kw = dict(model="tiny", prompt=prompt, max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    if not stream:
        r = c.completions.create(**kw)
        return r.usage.prompt_tokens_details.cached_tokens, r.choices[0].model_extra.get("token_ids") or [
            r.choices[0].text]
    chunks = list(c.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    ids = [t for ch in chunks if ch.choices for t in (ch.choices[0].model_extra or {}).get("token_ids") or []]
    return chunks[-1].usage.prompt_tokens_details.cached_tokens, ids


def measure(server: Server, prompts: list[list[int]]) -> tuple[list[int], float, dict[str, float]]:
    """Prime with the first prompt, then send the rest four at a time (streamed and not); the cached
    tokens of each measured request, the hit rate of the measured window, and the counter deltas."""
    complete(server, prompts[0], stream=False)
    before = server.metrics()
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda a: complete(server, a[1], stream=bool(a[0] % 2)), enumerate(prompts[1:])))
    after = server.metrics()
    delta = {k: after[k] - before.get(k, 0.0) for k in (P + "queries_total", P + "hits_total")}
    return [c for c, _ in got], delta[P + "hits_total"] / delta[P + "queries_total"], delta


def test_half_shared_prompts_hit_half_with_caching_on_and_none_off(tiny):
    prompts = half_shared(9, 8 * BLOCK, seed=1)
    on = Server(tiny, "--served-model-name", "tiny", "--enable-prefix-caching")
    try:
        cached, rate, delta = measure(on, prompts)
    finally:
        on.stop()
    assert cached == [8 * BLOCK] * 8  # the whole shared prefix, in every response (streamed or not)
    assert delta == {P + "queries_total": 8 * 16 * BLOCK, P + "hits_total": 8 * 8 * BLOCK}
    assert rate == pytest.approx(0.5, abs=0.05)
    off = Server(tiny, "--served-model-name", "tiny")
    try:
        cached, rate, delta = measure(off, prompts)
    finally:
        off.stop()
    assert cached == [0] * 8
    assert delta[P + "queries_total"] == 8 * 16 * BLOCK and rate == 0.0


def test_cached_tokens_are_whole_blocks_and_outputs_do_not_change(tiny):
    """A prefix that ends inside a block is found up to its last whole block; a repeated prompt has all
    its blocks found but the one holding its last token; greedy tokens are those of a fresh server."""
    rng = random.Random(4)
    base = [rng.randrange(10, 500) for _ in range(3 * BLOCK)]
    prompts = [base, base[:40] + [7, 8, 9], list(base)]
    s = Server(tiny, "--served-model-name", "tiny", "--enable-prefix-caching")
    try:
        got = [complete(s, p, stream=i == 1) for i, p in enumerate(prompts)]
    finally:
        s.stop()
    assert [c for c, _ in got] == [0, 40 // BLOCK * BLOCK, 2 * BLOCK]
    fresh = Server(tiny, "--served-model-name", "tiny")
    try:
        want = [complete(fresh, p, stream=i == 1)[1] for i, p in enumerate(prompts)]
    finally:
        fresh.stop()
    assert [ids for _, ids in got] == want
    assert got[0][1] == got[2][1]
