"""The folders' import rules (docs/development.md, "Layout and import names"), read from the source with `ast`.

- engine/ and workloads/ never import k2bench.harness or k2bench.dashboard (no folder-level cycles);
- harness/ reaches k2bench.engine only through the thin CLI doors harness/commands/serve.py and
  harness/commands/engine.py, and there only inside functions (so the harness installs and starts
  without torch);
- dashboard/ never imports k2bench.engine;
- nothing outside harness/commands/ imports k2bench.harness.commands (the commands are the top: argument
  handling and printing; only harness/cli.py loads them, by name);
- no import circle between files (inside a folder or across): module A importing B that imports A, however
  long the loop. A package's __init__.py only hands names on, so an import of a package is not followed.

Every import statement counts, wherever it sits (TYPE_CHECKING blocks and functions included), as does
`importlib.import_module("<constant>")`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("engine", "workloads", "harness", "dashboard")  # each is the package k2bench.<folder>
ENGINE_DOORS = ("harness/commands/serve.py", "harness/commands/engine.py")
COMMANDS = "k2bench.harness.commands"
COMMAND_LOADER = "harness/cli.py"


@dataclass(frozen=True)
class Import:
    file: str  # relative to ROOT
    line: int
    module: str  # absolute dotted name
    top_level: bool  # executed when the module is imported (not inside a function)


def _package_of(rel: str) -> list[str]:
    """The package a file's relative imports start from: k2bench.<folder>.<subfolders>."""
    return ["k2bench", *Path(rel).parts[:-1]]


def imports_of(source: str, rel: str) -> list[Import]:
    tree = ast.parse(source, filename=rel)
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(Import(rel, child.lineno, alias.name, not in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    package = _package_of(rel)
                    base = package[: len(package) - (child.level - 1)]
                    module = ".".join(base + ([child.module] if child.module else []))
                else:
                    module = child.module or ""
                # `from k2bench import harness` imports k2bench.harness: record each name as a module too
                found.append(Import(rel, child.lineno, module, not in_function))
                found.extend(Import(rel, child.lineno, f"{module}.{alias.name}", not in_function)
                             for alias in child.names)
            elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                  and child.func.attr == "import_module" and child.args
                  and isinstance(child.args[0], ast.Constant) and isinstance(child.args[0].value, str)):
                found.append(Import(rel, child.lineno, child.args[0].value, not in_function))
            visit(child, inside)

    visit(tree, False)
    return found


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violations(imports: list[Import]) -> list[str]:
    """One line per import statement that breaks a rule."""
    bad: dict[tuple[str, int], str] = {}
    for imp in imports:
        folder = imp.file.split("/", 1)[0]
        where = f"{imp.file}:{imp.line} imports {imp.module}"
        if folder in ("engine", "workloads"):
            for other in ("k2bench.harness", "k2bench.dashboard"):
                if _under(imp.module, other):
                    bad.setdefault((imp.file, imp.line), f"{where}: {folder}/ must not import {other}")
        if (_under(imp.module, COMMANDS) and not imp.file.startswith("harness/commands/")
                and imp.file != COMMAND_LOADER):
            bad.setdefault((imp.file, imp.line), f"{where}: only the commands import the commands; move what "
                           "is shared out of harness/commands/")
        if folder == "dashboard" and _under(imp.module, "k2bench.engine"):
            bad.setdefault((imp.file, imp.line), f"{where}: the dashboard must not import the engine")
        if folder == "harness" and _under(imp.module, "k2bench.engine"):
            if imp.file not in ENGINE_DOORS:
                bad.setdefault((imp.file, imp.line), f"{where}: the harness reaches the engine only through "
                               f"`k2bench serve` / `k2bench engine` ({', '.join(ENGINE_DOORS)})")
            elif imp.top_level:
                bad.setdefault((imp.file, imp.line),
                               f"{where}: import the engine inside a function (lazily), not at module level")
    return list(bad.values())


def module_of(rel: str) -> str:
    parts = ["k2bench", *Path(rel).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def circles(imports: list[Import], files: list[str]) -> list[list[str]]:
    """Each import circle among ``files`` (relative paths), as the files of one strongly connected
    component (Tarjan's algorithm); [] when the graph has no loop."""
    by_module = {module_of(f): f for f in files if not f.endswith("__init__.py")}
    edges: dict[str, set[str]] = {f: set() for f in files}
    for imp in imports:
        target = by_module.get(imp.module)
        if target and target != imp.file:
            edges.setdefault(imp.file, set()).add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def files_of(root: Path = ROOT) -> list[str]:
    return [p.relative_to(root).as_posix() for folder in FOLDERS for p in sorted((root / folder).rglob("*.py"))]


def scan(root: Path = ROOT) -> list[Import]:
    found = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            found.extend(imports_of(path.read_text(encoding="utf-8"), rel))
    return found


def test_the_tree_keeps_the_import_rules() -> None:
    found = scan()
    assert len({imp.file for imp in found}) > 40  # the scan really read the folders
    assert violations(found) == []


def test_no_import_circle() -> None:
    assert circles(scan(), files_of()) == []


def room_circles(imports: list[Import], files: list[str], folder: str = "harness") -> list[list[str]]:
    """Circles among the rooms of ``folder``: each of its sub-folders and top-level modules is one room,
    and an import between two files of different rooms is an arrow between the rooms. The stages of
    the harness must read one way (docs/development.md draws them)."""
    def room(rel: str) -> str | None:
        parts = Path(rel).parts
        if parts[0] != folder or len(parts) < 2 or parts[1] == "__init__.py":
            return None
        return f"{folder}/{parts[1]}"

    by_module = {module_of(f): f for f in files}
    arrows = [Import(src, imp.line, dst, imp.top_level) for imp in imports
              if (src := room(imp.file)) and (target := by_module.get(imp.module))
              and (dst := room(target)) and dst != src]
    rooms = sorted({r for f in files if (r := room(f))})
    return circles([Import(a.file, a.line, module_of(a.module + ".py"), a.top_level) for a in arrows], rooms)


def test_the_harness_stages_form_no_circle() -> None:
    assert room_circles(scan(), files_of()) == []


def test_a_circle_between_stages_is_caught() -> None:
    sources = {"harness/load/loadgen.py": "from k2bench.harness.run.watch import W\n",
               "harness/run/watch.py": "from k2bench.harness.measure import metrics\n",
               "harness/measure/metrics.py": "def f():\n    from k2bench.harness.load import loadgen\n"}
    imports = [imp for rel, text in sources.items() for imp in imports_of(text, rel)]
    assert circles(imports, list(sources)) == [sorted(sources)]  # a file-level circle too
    assert room_circles(imports, list(sources)) == [["harness/load", "harness/measure", "harness/run"]]
    sources["harness/run/watch.py"] = "X = 1\n"  # one arrow fewer: no circle
    imports = [imp for rel, text in sources.items() for imp in imports_of(text, rel)]
    assert room_circles(imports, list(sources)) == []


@pytest.mark.parametrize("sources", [
    {"harness/store/a.py": "from k2bench.harness.store.b import x\n",
     "harness/store/b.py": "def f():\n    from k2bench.harness.store import a\n"},  # lazy imports count
    {"engine/kernels/k.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..model.m import M\n",
     "engine/model/m.py": "from k2bench.engine.model.p import P\n",
     "engine/model/p.py": "from k2bench.engine.kernels import k\n"},  # across sub-folders, TYPE_CHECKING too
])
def test_an_import_circle_is_caught(sources: dict[str, str]) -> None:
    imports = [imp for rel, text in sources.items() for imp in imports_of(text, rel)]
    assert circles(imports, list(sources)) == [sorted(sources)]
    first = next(iter(sources))  # break one arrow: no circle
    rest = [imp for imp in imports if imp.file != first]
    assert circles(rest, list(sources)) == []


@pytest.mark.parametrize(("rel", "source", "complaint"), [
    ("engine/config.py", "from k2bench.harness.errors import UserError\n", "engine/ must not import k2bench.harness"),
    ("engine/model/layers.py", "from ...harness import loadgen\n", "engine/ must not import k2bench.harness"),
    ("workloads/loader.py", "def f():\n    from k2bench.harness.load.loadgen import Prompt\n",
     "workloads/ must not import k2bench.harness"),
    ("workloads/loader.py", "from k2bench import dashboard\n", "workloads/ must not import k2bench.dashboard"),
    ("workloads/loader.py", "import importlib\nimportlib.import_module('k2bench.harness.cli')\n",
     "workloads/ must not import k2bench.harness"),
    ("engine/server.py", "import k2bench.dashboard.data\n", "engine/ must not import k2bench.dashboard"),
    ("harness/run/sweep.py", "from k2bench.engine.tiny import write_tiny_checkpoint\n", "only through"),
    ("harness/analysis/regress.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    from k2bench.engine import config\n", "only through"),
    ("harness/commands/serve.py", "from k2bench.engine.build import build_engine\n", "inside a function"),
    ("dashboard/app.py", "def page():\n    import k2bench.engine.runtime_config\n",
     "dashboard must not import the engine"),
    ("harness/run/jobrun.py", "from k2bench.harness.commands.sweep import parse_count\n", "only the commands"),
    ("harness/servers/launch.py", "def f():\n    from k2bench.harness.commands import common\n", "only the commands"),
    ("dashboard/app.py", "from k2bench.harness import commands\n", "only the commands"),
])
def test_a_forbidden_import_is_caught(rel: str, source: str, complaint: str) -> None:
    found = violations(imports_of(source, rel))
    assert len(found) == 1 and rel in found[0] and complaint in found[0]


@pytest.mark.parametrize(("rel", "source"), [
    ("harness/commands/serve.py", "def register(sub):\n    from k2bench.engine.runtime_config import RuntimeConfig\n"),
    ("harness/run/sweep.py", "from k2bench.workloads.prompts import Prompt\nfrom k2bench.errors import UserError\n"),
    ("engine/server.py", "from k2bench.errors import UserError\nfrom k2bench.net import free_port\n"),
    ("dashboard/data.py", "from k2bench.harness.store import Store\n"),
    ("workloads/prompts.py", "from k2bench.workloads.loader import Workload\nfrom .loader import Workload\n"),
    ("harness/commands/sweep.py", "from k2bench.harness.commands.common import add_db_arg\n"),
    ("harness/cli.py", "import importlib\nimportlib.import_module('k2bench.harness.commands.sweep')\n"),
])
def test_allowed_imports_pass(rel: str, source: str) -> None:
    assert violations(imports_of(source, rel)) == []
