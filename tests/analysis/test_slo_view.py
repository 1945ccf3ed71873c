"""SLO figures of stored levels: a level swept under the comparison's SLO keeps its stored figures, any
other is recomputed from its requests; runs swept under different SLOs need --slo."""

from __future__ import annotations

import pytest

from k2bench.errors import UserError
from k2bench.harness.analysis.slo_view import comparison_slo, with_slo
from k2bench.harness.load.records import RequestRecord
from k2bench.harness.measure.metrics import summarize_level
from k2bench.harness.measure.slo import parse_slo
from k2bench.harness.store import Store

MS = 1_000_000


def _records(ttfts_ms: list[float]) -> list[RequestRecord]:
    out = []
    for i, ttft in enumerate(ttfts_ms):
        send = i * 1000 * MS
        tokens = [send + int(ttft * MS), send + int((ttft + 10) * MS)]
        out.append(RequestRecord(index=i, concurrency=1, warmup=False, requested_input_tokens=8,
                                 requested_output_tokens=2, send_ns=send, token_ns=tokens, end_ns=tokens[-1],
                                 prompt_tokens=8, output_tokens=2, success=True))
    return out


def _run(store: Store, slo: str | None, stored: dict | None) -> int:
    run_id = store.create_run({"engine": "e", "model": "m", "num_gpus": 1, "started_at": "2026-12-01T00:00:00Z",
                               "slo": slo})
    recs = _records([10, 20, 30, 40])
    point = summarize_level(recs, concurrency=1, num_gpus=1)
    point.update(stored or {})
    store.add_point(run_id, point, recs)
    store.finish_run(run_id, "complete")
    return run_id


def test_stored_figures_kept_only_under_their_own_slo(db_url):
    with Store.open(db_url) as store:
        # the stored attainment is deliberately not what the requests give, to see which one is read
        marked = _run(store, "ttft_ms=25", {"slo_attainment": 0.125, "slo_met": 1})
        plain = _run(store, None, None)
        frame = store.points_frame([marked, plain])
        same = with_slo(store, frame, parse_slo("ttft_ms=25"))
        other = with_slo(store, frame, parse_slo("ttft_ms=35"))
    by_run = dict(zip(same["run_id"], same["slo_attainment"], strict=True))
    assert by_run == {marked: 0.125, plain: 0.5}  # TTFTs 10, 20 of 10..40 are within 25 ms
    assert list(other["slo_attainment"]) == [0.75, 0.75]  # both recomputed under another SLO
    assert set(other["slo"]) == {"ttft_ms=35"}


def test_comparison_slo():
    assert comparison_slo(None, [{"slo": None}]) is None
    assert comparison_slo(None, [{"slo": "ttft_ms=5"}, {"slo": None}]).text == "ttft_ms=5"
    assert comparison_slo("tpot_ms=9", [{"slo": "ttft_ms=5"}]).text == "tpot_ms=9"
    with pytest.raises(UserError, match="different SLOs.*--slo"):
        comparison_slo(None, [{"slo": "ttft_ms=5"}, {"slo": "ttft_ms=6"}])


def test_a_change_of_slo_is_no_change_point(tmp_path, capsys):
    """Twelve runs with the same requests: the first six stored under a tight SLO (attainment 0.25), the
    last six under a loose one (0.75). Scanned under the newest run's SLO, the series is flat."""
    from k2bench.harness.cli import main
    from k2bench.harness.measure.slo import attainment

    db = f"sqlite:///{tmp_path / 'k.db'}"
    with Store.open(db) as store:
        for i in range(12):
            slo = "ttft_ms=15" if i < 6 else "ttft_ms=35"
            run_id = store.create_run({"engine": "e", "model": "m", "num_gpus": 1, "branch": "main", "slo": slo,
                                       "commit": f"{i:040x}", "started_at": f"2026-11-{10 + i:02d}T00:00:00Z"})
            recs = _records([10 + i % 3, 20, 30, 40])
            point = summarize_level(recs, concurrency=1, num_gpus=1)
            point.update(attainment(recs, parse_slo(slo), duration_s=point["duration_s"], num_gpus=1).fields())
            store.add_point(run_id, point, recs)
            store.finish_run(run_id, "complete")
        stored = store.points_frame()["slo_attainment"].tolist()
    assert stored == [0.25] * 6 + [0.75] * 6  # what a scan of the stored figures would see
    assert main(["changepoints", "--db", db, "--metric", "slo_attainment", "--no-store"]) == 0
    assert "0 change point(s)" in capsys.readouterr().out
