"""The engine's folders are layers: model and kernels never reach into the runtime, and nothing in the
engine imports the harness (the harness starts the engine as a server process, docs/development.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "engine"
FORBIDDEN = {
    "model": ("k2bench.harness", "k2bench.engine.runtime"),
    "kernels": ("k2bench.harness", "k2bench.engine.runtime"),
    "runtime": ("k2bench.harness",),
}


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_no_import_crosses_a_layer(folder):
    files = sorted((ENGINE / folder).rglob("*.py"))
    assert files, f"engine/{folder} has no modules"
    crossing = [f"{f.relative_to(ENGINE)}: {name}" for f in files for name in _imports(f)
                if name.startswith(FORBIDDEN[folder])]
    assert crossing == []


def test_the_engine_never_imports_the_harness():
    crossing = [f"{f.relative_to(ENGINE)}: {name}" for f in sorted(ENGINE.rglob("*.py")) for name in _imports(f)
                if name.startswith("k2bench.harness")]
    assert crossing == []
