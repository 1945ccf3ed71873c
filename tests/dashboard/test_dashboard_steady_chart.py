"""The run page's slices chart shows a level's stored slices as they are, its steady window shaded."""

from __future__ import annotations

from k2bench.dashboard.steady_charts import slices_figure
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure.metrics import summarize_level

S = 1_000_000_000


def _level() -> dict:
    """Concurrency 2: two requests from 0 s, one ends at 3 s, one at 4 s; a token every 0.5 s each."""
    recs = []
    for i, end in enumerate((3, 4)):
        tokens = [S * 10 + int((0.5 + 0.5 * k) * S) for k in range(int(end / 0.5))]
        recs.append(RequestRecord(index=i, concurrency=2, warmup=False, requested_input_tokens=4,
                                  requested_output_tokens=len(tokens), send_ns=S * 10, token_ns=tokens,
                                  end_ns=tokens[-1], prompt_tokens=4, output_tokens=len(tokens), success=True))
    return summarize_level(recs, concurrency=2, num_gpus=1)


def test_slices_drawn_as_stored_with_the_window_shaded():
    point = _level()
    fig = slices_figure(point)
    sl = point["steady"]["slices"]
    tput, flight, tpot = fig.data
    assert list(tput.x) == sl["t_s"] == [0.0, 1.0, 2.0, 3.0]
    # stamps at 0.5, 1.0, ... s; the last slice is closed on the right (4.0 s, the level's end, is in it)
    assert list(tput.y) == sl["output_tok_s"] == [2.0, 4.0, 4.0, 4.0]
    assert list(flight.y) == sl["in_flight"] and sl["in_flight"][0] == 2.0 and sl["in_flight"][3] == 1.0
    assert list(tpot.y) == sl["tpot_ms"] and set(sl["tpot_ms"][1:]) == {500.0}
    shaded = [s for s in fig.layout.shapes if s.type == "rect"]
    # ceil(0.9 x 2) = 2 in flight from 0 s until the first end at 3 s
    assert len(shaded) == 3 and (shaded[0].x0, shaded[0].x1) == (0.0, 3.0)
    assert "steady state (shaded) 0.0-3.0 s" in fig.layout.title.text


def test_level_without_slices_draws_nothing():
    assert slices_figure({"concurrency": 4, "steady": None}) is None
