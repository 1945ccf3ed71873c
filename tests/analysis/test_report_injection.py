"""Hostile names in stored runs cannot change the PR comment's markup or its tables' structure.

The comment is rendered with markdown-it-py (CommonMark plus GFM tables, raw HTML on, as GitHub
parses it before sanitising) and the rendered HTML is checked: no injected element, no extra heading,
no live mention, and every table row has its header's column count with its status cell intact.
"""

from __future__ import annotations

import re

from analysis_data import load_fixture
from markdown_it import MarkdownIt

from k2bench.harness.analysis.mdsafe import md_code, md_text
from k2bench.harness.cli import main
from k2bench.harness.store import Store

HOSTILE = ("x<img src=x onerror=alert(1)>\n# Injected heading\n@everyone look | ❌ | `tick [/red] "
           "[click](https://example.invalid) **b** ~~s~~ \\")
HOSTILE_TASK = "task|@team\n## h `x` <script>alert(1)</script>"
HOSTILE_REASON = "bad | level\n### fake heading <b>bold</b> @everyone"


def _render(text: str) -> str:
    return MarkdownIt("commonmark", {"html": True}).enable("table").enable("strikethrough").render(text)


def _tables(text: str) -> list[list[list[str]]]:
    """Each table of the rendered markdown as rows of cell texts (header row first)."""
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    tables, rows, cells = [], None, None
    for tok in md.parse(text):
        if tok.type == "table_open":
            rows = []
        elif tok.type == "table_close":
            tables.append(rows)
            rows = None
        elif tok.type == "tr_open":
            cells = []
        elif tok.type == "tr_close":
            rows.append(cells)
        elif tok.type == "inline" and rows is not None and cells is not None:
            cells.append(tok.content)
    return tables


def _eval(task: str, right: int, n: int = 200) -> dict:
    items = [1.0] * right + [0.0] * (n - right)
    return {"task": task, "metric": "exact_match", "value": right / n, "n": n, "items": items}


def _hostile_store(tmp_path) -> tuple[str, str]:
    url = f"sqlite:///{tmp_path / 'k2.db'}"
    fx = load_fixture("drop10")
    runs = fx["runs"]
    with Store.open(url) as store:
        for i, doc in enumerate(runs):
            doc["run"].update(engine=HOSTILE[:200], model=HOSTILE[:200], hardware="<b>gpu</b>|@everyone")
            candidate = i == len(runs) - 1
            if candidate:
                doc["run"]["branch"] = "feature`|<i>\n@everyone"
                doc["points"][0]["valid"] = False
                doc["points"][0]["invalid_reason"] = HOSTILE_REASON
            elif i == len(runs) - 2:
                doc["run"]["commit"] = "`@everyone|<img>"
            doc["evals"] = [_eval(HOSTILE_TASK, 120 if candidate else 190)]
            store.import_run(doc)
    return url, runs[-1]["run"]["commit"][:12]


def test_hostile_names_leave_the_comment_markup_and_tables_intact(tmp_path):
    url, cand = _hostile_store(tmp_path)
    out = tmp_path / "report.md"
    code = main(["regress", "--candidate", cand, "--baseline-mode", "latest", "--db", url, "--out", str(out),
                 "--fail-on-regression"])
    assert code == 1
    text = out.read_text()
    html = _render(text)
    assert not re.search(r"<(script|b|i)\b|<[^>]*onerror", html), html  # injected HTML arrives as text only
    assert re.findall(r"<img\b[^>]*>", html) == ['<img src="report.png" alt="frontiers" />']  # the plot only
    assert re.findall(r"<h\d", html) == ["<h3"]  # the comment's own heading, no injected one
    assert "@everyone" not in html and "@team" not in html  # mentions cannot ping
    assert "<a " not in html  # no injected link
    assert "onerror" in html and "Injected heading" in html  # shown, not dropped
    tables = _tables(text)
    assert len(tables) >= 3  # accuracy, change table, all comparisons
    for table in tables:
        width = len(table[0])
        assert all(len(row) == width for row in table), table
    accuracy = next(t for t in tables if t[0][0] == "accuracy")
    assert accuracy[1][-1] == "❌ regression" and "task" in accuracy[1][0]
    delta = next(t for t in tables if t[0][0] == "conc")
    by_conc = {row[0]: row for row in delta[1:]}
    tput = delta[0].index("tok/s/GPU")
    assert by_conc["16"][tput].endswith("❌")  # the regression's status survives in its own column
    assert by_conc[delta[1][0]][1] == "invalid"  # the hostile invalid level keeps its cell


def test_md_code_cannot_be_closed_from_inside():
    for value in ("a`b", "``x``", "`", "a|b"):
        html = _render(f"| c |\n|---|\n| {md_code(value, in_table=True)} |\n")
        assert html.count("<code>") == 1 and "<td><code>" in html, html
    assert md_text("a\r\nb\x00c\u2028d") == "a b c d"
    assert len(md_text("y" * 1000)) == 200
