"""Every dependency `pyproject.toml` names is used, and every package actonce imports is named.

A dependency named and never imported drifts (it was `jsonpatch` and `pydantic-settings`); one
imported and never named breaks the day a lattice package stops pulling it in. The few used
without an import say how they are used.
"""

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[1]
PRODUCTION: Final = [ROOT / "actonce" / "__init__.py", *ROOT.glob("worker/**/*.py")]
PRODUCTION += [*ROOT.glob("tasks/**/*.py")]

USED_WITHOUT_IMPORT: Final = {
    "flower": "run as `celery -A actonce.worker.app flower`",
}
"""Dependencies the package uses without importing them, and how."""


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = set()
    for requirement in project["dependencies"]:
        names.add(re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower())
    return names


def _imported_top_levels() -> set[str]:
    names = set()
    for path in PRODUCTION:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"actonce"}


def _distributions(top_levels: set[str]) -> dict[str, set[str]]:
    """Each imported top-level name's distributions, lower-cased."""
    known = importlib.metadata.packages_distributions()
    return {name: {d.lower() for d in known.get(name, [])} for name in top_levels}


def test_every_declared_dependency_is_imported_or_says_how_it_is_used() -> None:
    used = set().union(*_distributions(_imported_top_levels()).values())

    unused = _declared() - used - set(USED_WITHOUT_IMPORT)

    assert not unused, f"named in pyproject.toml and never imported: {sorted(unused)}"


def test_every_imported_package_is_declared() -> None:
    declared = _declared()
    undeclared = {
        name: sorted(distributions)
        for name, distributions in _distributions(_imported_top_levels()).items()
        if not distributions & declared
    }

    assert not undeclared, f"imported by actonce but not named in pyproject.toml: {undeclared}"
