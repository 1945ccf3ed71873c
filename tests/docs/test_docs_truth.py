"""The docs stay true: what README.md, docs/, engine/README.md and the module docstrings name exists.

Checked: repository files and folders (``harness/eval/gate.py``, ``bench/results/``), ``k2bench.*``
modules (and a name right after one, ``k2bench.harness.load.records.RequestRecord``), schema versions
(``k2bench.run/N``: the current one, or an older one only where the line says it is upgraded),
``k2bench <command>`` (the CLI's own subcommands) and documents (``*.md``) that must be in the
repository. Paths that git ignores (results/k2bench.db, results/logs/) are where k2bench writes,
not claims that a file is in the repository, so they are left alone; so are placeholders (<...>),
globs and absolute paths. Each check reads files only: no k2bench module is imported but the CLI.
"""

from __future__ import annotations

import ast
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# import name -> folder, as setup.py maps them
PACKAGES = {"k2bench": "k2bench", "k2bench.harness": "harness", "k2bench.engine": "engine",
            "k2bench.workloads": "workloads", "k2bench.dashboard": "dashboard"}
CODE_FOLDERS = ("harness", "engine", "workloads", "dashboard", "k2bench")
DOCSTRING_FOLDERS = (*CODE_FOLDERS, "tests", "bench")
FORMAT = "k2bench.run"  # the JSON document's name (k2bench.run/<version>), not a module
# an older version may be named where the text says old documents are upgraded on import
UPGRADE_WORDS = re.compile(r"\b(imports? as|upgrade[sd]?|older|earlier|version-\d)\b", re.IGNORECASE)


@cache
def tracked() -> frozenset[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return frozenset(out.split())


@cache
def tracked_dirs() -> frozenset[str]:
    return frozenset(str(p) for f in tracked() for p in Path(f).parents if str(p) != ".")


@cache
def top_level() -> frozenset[str]:
    return frozenset(f.split("/")[0] for f in tracked())


def ignored(path: str) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0


def documents() -> dict[str, str]:
    """{repository path: text} of every page and docstring the check reads."""
    pages = ["README.md", "engine/README.md", *sorted(f for f in tracked() if f.startswith("docs/") and
                                                        f.endswith(".md"))]
    out = {p: (ROOT / p).read_text(encoding="utf-8") for p in pages if (ROOT / p).exists()}
    for f in sorted(tracked()):
        if f.endswith(".py") and f.split("/")[0] in DOCSTRING_FOLDERS and (ROOT / f).exists():
            doc = ast.get_docstring(ast.parse((ROOT / f).read_text(encoding="utf-8")))
            if doc:
                out[f] = doc
    return out


# ---------------------------------------------------------------- what a text names

PATH = re.compile(r"(?<![\w./~$<-])((?:\.?[A-Za-z_][\w.-]*/)+[\w.-]*)")
# a document named as a reference (not a file a command writes: --out report.md)
DOC = re.compile(r"(?<![\w/.-])(?<!--out )(?<!--md )(?<!`)(?<!and )([A-Za-z_][\w.-]*\.md)\b")
# a project document (README.md, DESIGN.md, CHANGELOG.md): named anywhere, in backticks too, it must exist
PROJECT_DOC = re.compile(r"(?<![\w/.-])([A-Z][A-Z0-9_-]*\.md)\b")
README_SECTION = re.compile(r"README(?:\.md)?\W{0,3}\(?\s*\"([^\"]+)\"\s*section")
MODULE = re.compile(r"(?<![\w/.-])(k2bench(?:\.[A-Za-z_]\w*)+)(?![\w/-])")
SCHEMA = re.compile(r"k2bench\.run/(\d+)")
COMMAND = re.compile(r"(?<![\w./-])k2bench ([a-z][a-z-]*)")


def code_spans(text: str) -> list[str]:
    """Inline code and fenced blocks of a markdown page: where commands are written to be typed."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return blocks + re.findall(r"``?([^`\n]+)``?", rest)


def path_problem(name: str, where: str) -> str | None:
    name = name.rstrip(".,:;")
    first = name.split("/")[0]
    if first not in top_level() or any(c in name for c in "*<>{}") or "..." in name:
        return None
    bare = name.rstrip("/")
    if bare in tracked() or bare in tracked_dirs() or ignored(bare):
        return None
    return f"{where}: names {name}, which is not in the repository"


def relative_path_problem(name: str, where: str) -> str | None:
    """engine/README.md and the docs name files relative to their own folder (``model/config.py``)."""
    name = name.rstrip(".,:;")
    if any(c in name for c in "*<>{}") or "..." in name or name.split("/")[0] in top_level():
        return None
    if not re.search(r"\.(py|md|sh|toml|yml|yaml|json)$", name):
        return None
    here = Path(where).parent
    candidates = [here / name, *(Path(top) / name for top in CODE_FOLDERS), Path("tests") / name,
                  Path("tests") / here / name]
    if any(str(c) in tracked() for c in candidates):
        return None
    return f"{where}: names {name}, found neither under {here}/ nor under a code folder"


def module_problem(dotted: str, where: str) -> str | None:
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        base = ".".join(parts[:cut])
        pkg = next((p for p in sorted(PACKAGES, key=len, reverse=True)
                    if base == p or base.startswith(p + ".")), None)
        if pkg is None:
            continue
        rel = Path(PACKAGES[pkg], *base[len(pkg):].lstrip(".").split(".")) if base != pkg else Path(PACKAGES[pkg])
        for file in (rel.with_suffix(".py"), rel / "__init__.py"):
            if str(file) in tracked():
                if cut == len(parts):
                    return None
                attr = parts[cut]
                source = (ROOT / file).read_text(encoding="utf-8")
                if re.search(rf"^\s*(?:def|class|async def)\s+{attr}\b|^\s*{attr}\b\s*[:=]|import .*\b{attr}\b",
                             source, re.MULTILINE) or (rel / attr).is_dir() or \
                        str((rel / attr).with_suffix(".py")) in tracked():
                    return None
                return f"{where}: names {dotted}, but {base} has no {attr}"
    return f"{where}: names the module {dotted}, which does not exist"


@cache
def commands() -> dict[str, frozenset[str]]:
    """{subcommand: its own subcommands} from the CLI's parser."""
    import argparse

    from k2bench.harness.cli import build_parser

    def subs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        return {name: p for a in parser._actions if isinstance(a, argparse._SubParsersAction)
                for name, p in a.choices.items()}

    return {name: frozenset(subs(p)) for name, p in subs(build_parser()).items()}


def schema_version() -> int:
    text = (ROOT / "harness" / "record" / "schema.py").read_text(encoding="utf-8")
    return int(re.search(r"^SCHEMA_VERSION = (\d+)", text, re.MULTILINE).group(1))


def problems(where: str, text: str) -> list[str]:
    found = []
    markdown = where.endswith(".md")
    for name in set(PATH.findall(text)):
        found.append(path_problem(name, where))
        if markdown or where.startswith("engine/"):
            found.append(relative_path_problem(name, where))
    for doc in set(DOC.findall(text)) | set(PROJECT_DOC.findall(text)):
        if doc not in {Path(f).name for f in tracked()}:
            found.append(f"{where}: names {doc}, a document that is not in the repository")
    for dotted in set(MODULE.findall(text)) - {FORMAT}:
        found.append(module_problem(dotted, where))
    readme = re.sub(r"^```[^\n]*\n.*?^```", "", (ROOT / "README.md").read_text(encoding="utf-8"),
                    flags=re.MULTILINE | re.DOTALL)
    readme_heads = re.findall(r"^#+ (.+)$", readme, re.MULTILINE)
    for section in README_SECTION.findall(text):
        if not any(re.search(rf"\b{re.escape(section)}\b", h, re.IGNORECASE) for h in readme_heads):
            found.append(f"{where}: points to the README's {section!r} section, which README.md does not have")
    current = schema_version()
    for line in text.splitlines():
        for n in map(int, SCHEMA.findall(line)):
            if n > current or n < 1:
                found.append(f"{where}: names k2bench.run/{n}; the schema is version {current}")
            elif n < current and not UPGRADE_WORDS.search(line):
                found.append(f"{where}: names k2bench.run/{n} as if current; the schema is version {current}")
    for span in code_spans(text):
        for match in COMMAND.finditer(span):
            word = match.group(1)
            if word not in commands():
                found.append(f"{where}: names `k2bench {word}`, which is not a command")
                continue
            after = span[match.end():].split()
            if commands()[word] and after and re.fullmatch(r"[a-z][a-z-]*", after[0]) \
                    and after[0] not in commands()[word] and not after[0].startswith("-"):
                found.append(f"{where}: names `k2bench {word} {after[0]}`; {word} has "
                             f"{', '.join(sorted(commands()[word]))}")
    return [p for p in found if p]


def test_docs_name_only_what_exists() -> None:
    bad = sorted({p for where, text in documents().items() for p in problems(where, text)})
    assert not bad, "the docs name what does not exist:\n  " + "\n  ".join(bad)


# ---------------------------------------------------------------- the checker catches drift


@pytest.mark.parametrize("where,text,word", [
    ("README.md", "`k2bench export` / `import` move runs as `k2bench.run/1` JSON.", "k2bench.run/1"),
    ("README.md", "format: `k2bench.run/4`", "k2bench.run/4"),
    ("harness/x.py", "Definitions (see DESIGN.md \"Metric definitions\")", "DESIGN.md"),
    ("docs/x.md", "the rules in `STYLE.md`", "STYLE.md"),
    ("README.md", "<!-- tests/docs/test_readme_quickstart.py runs these -->", "test_readme_quickstart.py"),
    ("docs/x.md", "see k2bench.harness.nothere for it", "k2bench.harness.nothere"),
    ("docs/x.md", "see k2bench.harness.record.schema.NoSuchThing", "NoSuchThing"),
    ("docs/x.md", "```bash\nk2bench sweeep --conc 4\n```", "sweeep"),
    ("docs/x.md", "`k2bench suite runn FILE`", "suite runn"),
    ("engine/README.md", "| `model/nothere.py` | x |", "model/nothere.py"),
    ("harness/store/__init__.py", 'See STORE_API in the README ("store" section)', "'store' section"),
])
def test_each_kind_of_drift_is_caught(where: str, text: str, word: str) -> None:
    assert any(word in p for p in problems(where, text)), problems(where, text)


def test_what_exists_passes() -> None:
    text = ("`harness/eval/gate.py`, `bench/results/`, k2bench.harness.load.records.RequestRecord, "
            "`k2bench.run/2`; a `k2bench.run/1` document imports as version 2; results/k2bench.db; "
            "`k2bench suite run FILE`, `k2bench engine tiny`, see docs/store.md; "
            "`k2bench regress --out report.md`; the README (\"Quick start\" section)")
    assert problems("docs/x.md", text) == []
    assert problems("engine/README.md", "| `model/config.py` | `runtime/server.py` |") == []


def _page_targets(text: str, folder: str) -> set[str]:
    """Pages a list or table links to, as paths under docs/ (the changelog under either name)."""
    out = set()
    for target in re.findall(r"\]\(([^)#\s]+)", text):
        path = (Path(folder) / target).as_posix() if folder else target
        path = "docs/changelog.md" if path.endswith("bench/results/CHANGELOG.md") else path
        if path.startswith("docs/") and path.endswith(".md") and path != "docs/index.md":
            out.add(path.removeprefix("docs/"))
    return out


def test_readme_and_the_home_page_list_the_same_pages_as_the_site() -> None:
    import yaml

    def flat(nav) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, dict):
            return [p for v in nav.values() for p in flat(v)]
        return [p for item in nav for p in flat(item)]

    nav = set(flat(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])) - {"index.md"}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    readme_list = readme.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    index_table = index.split("## Where to read on", 1)[1].split("\n## ", 1)[0]
    assert _page_targets(readme_list, "") == nav, "README's page list differs from mkdocs.yml's nav"
    assert _page_targets(index_table, "docs") == nav, "docs/index.md's page table differs from mkdocs.yml's nav"


def test_dated_measurement_logs_live_in_the_changelog_only() -> None:
    """A page states the design and current behaviour; a heading with a date is a log entry, and the
    log is bench/results/CHANGELOG.md (engine/README.md kept one until 2026-12-02)."""
    pages = ["README.md", "engine/README.md", *(f for f in tracked() if f.startswith("docs/") and f.endswith(".md"))]
    dated = [f"{page}: {line}" for page in pages if (ROOT / page).exists()
             for line in (ROOT / page).read_text(encoding="utf-8").splitlines()
             if re.match(r"#+ .*\b20\d\d-\d\d-\d\d\b", line)]
    assert not dated, "dated entries belong in bench/results/CHANGELOG.md:\n  " + "\n  ".join(dated)
