"""How `k2bench serve` sets up its interpreter (server_process): the frozen start-up heap, and the
garbage collector's pauses on /metrics. The served checks read what the server process reports of
itself; the in-process ones compare with CPython's own counts (gc.get_stats)."""

from __future__ import annotations

import gc

import pytest
from test_runtime_server import PROMPT_IDS, Server

from k2bench.engine.runtime.server_process import GcPauses, JitCompiles, ProcessSettings, Stalls, freeze_heap


def test_the_pause_count_matches_cpythons_own_collection_count():
    pauses = GcPauses().install()
    try:
        before = [s["collections"] for s in gc.get_stats()]
        counted = list(pauses.count)
        for gen in (0, 1, 2, 2):
            gc.collect(gen)
        after = [s["collections"] for s in gc.get_stats()]
    finally:
        pauses.uninstall()
    assert [a - b for a, b in zip(after, before, strict=True)] == [p - c for p, c in
                                                                  zip(pauses.count, counted, strict=True)]
    assert pauses.count[2] - counted[2] >= 2
    assert pauses.seconds[2] > 0 and 0 < pauses.longest <= sum(pauses.seconds)
    n = list(pauses.count)
    gc.collect()
    assert pauses.count == n  # uninstalled: no longer counting
    assert pauses._callback not in gc.callbacks


def test_warmed_freezes_the_heap_restarts_the_longest_pause_and_starts_counting_compiles():
    stalls = Stalls()
    stalls.gc.install()
    try:
        gc.collect()
        assert stalls.gc.longest > 0
        ProcessSettings(gc_freeze=False).warmed(stalls)
        assert stalls.gc.longest == 0 and gc.get_freeze_count() == 0 and stalls.jit._ready
        junk = [[i] for i in range(1000)]  # noqa: F841 -- alive, so the freeze must keep it
        ProcessSettings().warmed(stalls)
        assert gc.get_freeze_count() > 1000
    finally:
        stalls.gc.uninstall()
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
    assert freeze_heap() > 0
    gc.unfreeze()


def test_compiles_count_only_once_ready_and_chain_the_hooks_before_them():
    """Triton calls its cache hook before a compile and its post-compile hook after; JitCompiles keeps any
    hooks set before it (calling them, and passing on what the first returns) and counts from `ready`."""
    knobs = pytest.importorskip("triton").knobs
    rt = knobs.runtime
    saved = rt.jit_cache_hook, rt.jit_post_compile_hook
    seen = []
    try:
        rt.jit_cache_hook = lambda **kw: seen.append(("before", kw["key"]))
        rt.jit_post_compile_hook = lambda **kw: seen.append(("after", kw["key"]))
        jit = JitCompiles().install()
        args = dict(repr="kernel(x: *bf16)", fn=None, compile=None, is_manual_warmup=False, already_compiled=False)

        def compile_(key):
            assert not rt.jit_cache_hook(key=key, **args)  # a true value would make Triton skip the compile
            rt.jit_post_compile_hook(key=key, **args)

        compile_("start-up")
        assert jit.count == 0 and jit.seconds == 0
        jit.ready()
        compile_("serving")
        assert jit.count == 1 and jit.seconds >= 0
        assert seen == [("before", "start-up"), ("after", "start-up"), ("before", "serving"), ("after", "serving")]
    finally:
        rt.jit_cache_hook, rt.jit_post_compile_hook = saved


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from k2bench.engine.model.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "tiny", quant="mxfp4")


def _served_settings(server: Server) -> tuple[dict[str, float], dict[str, float]]:
    """/metrics before and after some streamed requests."""
    before = server.metrics()
    c = server.client()
    for _ in range(4):
        for _chunk in c.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=100, stream=True,
                                           extra_body={"ignore_eos": True}):
            pass
    return before, server.metrics()


@pytest.mark.engine
@pytest.mark.slow
def test_serve_reports_its_interpreter_settings_and_gc_pauses(tiny):
    default = Server(tiny, "--served-model-name", "tiny")
    try:
        before, m = _served_settings(default)
    finally:
        default.stop()
    assert m["k2bench_gc_frozen_objects"] > 10_000  # torch and the engine, frozen once warmed up
    # the callback counts from before start-up (whose collections it saw), and only ever up
    for g in range(3):
        n, t = f'k2bench_gc_pauses_total{{generation="{g}"}}', f'k2bench_gc_pause_seconds_total{{generation="{g}"}}'
        assert m[n] >= before[n] and m[t] >= before[t], g
    assert m['k2bench_gc_pauses_total{generation="0"}'] > 0 and m['k2bench_gc_pause_seconds_total{generation="0"}'] > 0
    # longest counts from the end of warm-up, so the freeze's own full collection is not in it
    assert 0 <= m["k2bench_gc_pause_longest_seconds"] < m['k2bench_gc_pause_seconds_total{generation="2"}']
    assert m["k2bench_jit_compiles_total"] == 0  # the CPU engine compiles no Triton kernel

    other = Server(tiny, "--served-model-name", "tiny", "--no-gc-freeze")
    try:
        _, m = _served_settings(other)
    finally:
        other.stop()
    assert m["k2bench_gc_frozen_objects"] == 0
