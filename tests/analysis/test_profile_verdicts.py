"""A gate verdict of regression links both sides' profiles and shows their kernel-time diff; a verdict
without regression, or a side without a profile, adds nothing."""

from __future__ import annotations

import json

from analysis_data import load_fixture

from k2bench.harness.cli import main
from k2bench.harness.store import Store


def _summary(sample_us: float) -> dict:
    ops = {"engine.sample": sample_us, "aten::mm": 5000.0, "engine.forward": 900.0}
    return {"format": "k2bench.profile/1", "device": "cpu", "steps": 10, "window_s": 1.0, "ops_total": 3,
            "ops": [{"name": n, "kind": "cpu", "calls": 10, "self_us": us * 10, "total_us": us * 10,
                     "self_us_per_step": us} for n, us in ops.items()]}


def _db(tmp_path, name: str, profiled: dict[int, float]) -> tuple[str, str]:
    """The fixture history in a store; runs in ``profiled`` (position -> engine.sample µs/step) profiled."""
    url = f"sqlite:///{tmp_path / 'k2.db'}"
    fx = load_fixture(name)
    with Store.open(url) as store:
        ids = [store.import_run(doc) for doc in fx["runs"]]
        for pos, us in profiled.items():
            store.set_profile(ids[pos], {"concurrency": 16, "requests": 16, "completed": 16,
                                         "trace": f"/profiles/trace-{pos}.json", "summary": _summary(us)})
    return url, fx["runs"][-1]["run"]["commit"][:12]


def test_regression_report_links_both_profiles_and_ranks_the_slowed_function_first(tmp_path, capsys) -> None:
    # drop10: runs 0..4 are the baseline, run 5 the candidate; the newest profiled baseline run is used
    url, cand = _db(tmp_path, "drop10", {3: 80.0, 4: 100.0, 5: 2600.0})
    out = tmp_path / "report.md"
    assert main(["regress", "--candidate", cand, "--baseline-mode", "latest", "--db", url, "--out", str(out),
                 "--fail-on-regression"]) == 1
    capsys.readouterr()
    text = out.read_text()
    section = text[text.index("### Profiles"):]
    assert "- baseline (run 5): trace `/profiles/trace-4.json`" in section
    assert "- candidate (run 6): trace `/profiles/trace-5.json`" in section
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    assert rows[0] == "| `engine.sample` | cpu | 100.0 | 2,600.0 | +2,500.0 | 26.00x |"
    assert "`k2bench profile-diff 5 6`" in section
    assert main(["regress", "--candidate", cand, "--baseline-mode", "latest", "--db", url, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["overall"] == "regression" and doc["profiles"]["baseline"] == {"run": 5, "trace": "/profiles/trace-4.json"}
    assert doc["profiles"]["diff"][0]["name"] == "engine.sample"
    assert doc["profiles"]["diff"][0]["change_us_per_step"] == 2500.0


def test_no_profiles_section_without_a_regression_or_without_both_sides(tmp_path) -> None:
    url, cand = _db(tmp_path, "improve12", {4: 100.0, 5: 2600.0})
    assert main(["regress", "--candidate", cand, "--baseline-mode", "latest", "--db", url,
                 "--out", str(tmp_path / "a.md")]) == 0
    assert "### Profiles" not in (tmp_path / "a.md").read_text()
    (tmp_path / "k2.db").unlink()
    url, cand = _db(tmp_path, "drop10", {5: 2600.0})  # the candidate alone was profiled
    assert main(["regress", "--candidate", cand, "--baseline-mode", "latest", "--db", url,
                 "--out", str(tmp_path / "b.md")]) == 0
    assert "### Profiles" not in (tmp_path / "b.md").read_text()
