"""Maps the top-level folders onto the k2bench.* import names (metadata lives in pyproject.toml)."""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
FOLDERS = {"k2bench": "k2bench", "k2bench.harness": "harness", "k2bench.engine": "engine",
           "k2bench.workloads": "workloads", "k2bench.dashboard": "dashboard"}


def _packages() -> list[str]:
    found = []
    for name, folder in FOLDERS.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.append(".".join((name, *rel)))
    return found


setup(package_dir=FOLDERS, packages=_packages())
