"""Run-page timelines: the stored samples appear as they were, level after level on one time axis."""

from __future__ import annotations

from k2bench.dashboard import telemetry_charts as tc


def _point(conc: int, t: list[float], power: list[list[float]], gauges: dict[str, list[float]]) -> dict:
    gpus = [{"id": str(i), "power_w": p, "sm_clock_mhz": [1980.0] * len(p)} for i, p in enumerate(power)]
    return {"concurrency": conc, "trial": 0,
            "energy": {"power_valid": True, "raw": {"t_s": t, "gpus": gpus}},
            "server_metrics": {"counters": {}, "gauges": {}, "raw": {"t_s": t, "gauges": gauges}}}


def test_power_per_gpu_laid_end_to_end_with_level_marks():
    points = [_point(8, [0.0, 0.1, 0.2], [[300.0, 310.0, 320.0], [200.0, 210.0, 220.0]],
                     {"k2bench_kv_cache_usage_perc": [0.1, 0.5, 0.9]}),
              _point(4, [0.0, 0.1], [[100.0, 110.0], [90.0, 95.0]], {"k2bench_kv_cache_usage_perc": [0.0, 0.2]})]
    fig = tc.gpu_timeline(points)
    assert [t.name for t in fig.data] == ["GPU 0", "GPU 1"]
    gpu0 = fig.data[0]
    # concurrency 4 first (0..0.1 s), then concurrency 8 from 0.1 + 1 s; None breaks the line between levels
    assert list(gpu0.x) == [0.0, 0.1, None, 1.1, 1.2000000000000002, 1.3, None]
    assert list(gpu0.y) == [100.0, 110.0, None, 300.0, 310.0, 320.0, None]
    marks = [s for s in fig.layout.shapes]
    assert [s.x0 for s in marks] == [0.0, 1.1]
    assert [a.text for a in fig.layout.annotations] == ["c4", "c8"]
    assert "W" in fig.layout.yaxis.title.text
    clocks = tc.gpu_timeline(points, "sm_clock_mhz")
    assert set(v for v in clocks.data[1].y if v is not None) == {1980.0}


def test_server_gauges_and_absent_samples():
    points = [_point(4, [0.0, 1.0, 2.0], [[1.0, 1.0, 1.0]],
                     {"vllm:num_requests_running": [4, 4, 3], "vllm:num_requests_waiting": [2, 0, 0],
                      "vllm:kv_cache_usage_perc": [0.3, 0.4, 0.2]})]
    queue = tc.server_timeline(points, "queue")
    assert {t.name: list(t.y) for t in queue.data} == {"vllm:num_requests_running": [4, 4, 3, None],
                                                       "vllm:num_requests_waiting": [2, 0, 0, None]}
    assert [t.name for t in tc.server_timeline(points, "kv").data] == ["vllm:kv_cache_usage_perc"]
    bare = [{"concurrency": 4, "energy": None, "server_metrics": None}]
    assert tc.gpu_timeline(bare) is None and tc.server_timeline(bare) is None


def test_titles_keep_their_acronyms_and_the_roofline_labels_each_levels_share():
    points = [_point(4, [0.0, 0.1], [[100.0, 110.0]], {})]
    assert tc.gpu_timeline(points).layout.title.text == "GPU power per GPU"
    assert tc.gpu_timeline(points, "sm_clock_mhz").layout.title.text == "SM clock per GPU"
    roof = {"hardware": "H200", "dtype": "bf16", "source": "datasheet",
            "points": [{"concurrency": 4, "tput_per_gpu": 100.0, "interactivity": 50.0},
                       {"concurrency": 1, "tput_per_gpu": 30.0, "interactivity": 90.0}]}
    levels = [{"concurrency": 4, "tput_per_gpu": 40.0, "interactivity": {"median": 20.0}, "pct_roofline": 40.0},
              {"concurrency": 8, "tput_per_gpu": None, "interactivity": {"median": None}}]
    fig = tc.roofline_figure(levels, roof)
    limit, measured = fig.data
    assert list(limit.x) == [50.0, 90.0] and list(limit.y) == [100.0, 30.0]  # ordered along x
    assert list(measured.text) == ["c4 (40%)"] and list(measured.y) == [40.0]  # unmeasured level left out
