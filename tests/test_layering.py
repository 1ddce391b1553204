"""actonce's layout holds: one import name, arrows that run one way, and no import circle.

`tasks/` (`actonce.tasks`, what one attempt does) never imports `worker/` (`actonce.worker`, the
process side), so an app can use `RunActions` in process; no module of the package reaches itself
again through its imports; and nothing named `worker`, `tasks`, `demo`, `bench` or `lab` is
installed, because applications have their own `tasks.py`.
"""

import ast
import subprocess
import sys
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[1]
HALVES: Final = {"actonce.worker": ROOT / "worker", "actonce.tasks": ROOT / "tasks"}
"""Each half of the package, by import name, and the folder that holds it."""


def _modules() -> dict[str, Path]:
    modules = {"actonce": ROOT / "actonce" / "__init__.py"}
    for package, folder in HALVES.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports, `from package import module` as the module."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            origin = ".".join([*base, node.module or ""]) if node.level else node.module or ""
            origin = origin.rstrip(".")
            submodules = {f"{origin}.{alias.name}" for alias in node.names} & modules.keys()
            found.update(submodules or {origin})
    return {module for module in found if module in modules and module != name}


def test_the_layering_test_sees_both_halves_and_the_rooms() -> None:
    modules = _modules()
    assert {"actonce.tasks.outbound", "actonce.tasks.attempt", "actonce.worker.app"} <= set(modules)
    assert {"actonce.worker.dispatching.dispatcher", "actonce.worker.storage.one_run"} <= set(
        modules
    )


UNSAID: Final = frozenset({"alone", "listened", "reach", "host"})
"""Module names that said nothing of what they held, retired when `worker/` was given rooms."""


def test_worker_keeps_few_modules_at_its_top_level_and_rooms_for_the_rest() -> None:
    top = sorted(path.stem for path in HALVES["actonce.worker"].glob("*.py"))
    rooms = sorted(path.parent.name for path in HALVES["actonce.worker"].glob("*/__init__.py"))

    assert len(top) <= 16, top
    assert {"dispatching", "intake", "dead_letters", "storage", "process"} <= set(rooms), rooms


def test_no_module_is_named_for_nothing_it_holds() -> None:
    named = sorted(
        str(path.relative_to(ROOT))
        for folder in HALVES.values()
        for path in folder.rglob("*.py")
        if path.stem in UNSAID
    )

    assert not named, named


def test_no_module_of_tasks_imports_worker() -> None:
    modules = _modules()
    reaching = {
        name: sorted(m for m in _imported(name, path, modules) if m.startswith("actonce.worker"))
        for name, path in modules.items()
        if name.startswith("actonce.tasks")
    }
    assert not {name: found for name, found in reaching.items() if found}, (
        "actonce.tasks must not import actonce.worker: an app uses RunActions in process, and the "
        "tasks reach the process through actonce.tasks.task_host"
    )


def test_no_source_imports_the_bare_halves() -> None:
    names = ("worker", "tasks")
    sources = [*ROOT.glob("worker/**/*.py"), *ROOT.glob("tasks/*.py"), *ROOT.glob("demo/*.py")]
    sources += [*ROOT.glob("bench/*.py"), *ROOT.glob("lab/*.py"), *ROOT.glob("tests/**/*.py")]
    bare = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                if node.module.split(".")[0] in names:
                    bare.append(f"{path.relative_to(ROOT)}: from {node.module}")
            elif isinstance(node, ast.Import):
                bare += [
                    f"{path.relative_to(ROOT)}: import {alias.name}"
                    for alias in node.names
                    if alias.name.split(".")[0] in names
                ]
    assert not bare, f"import actonce.worker / actonce.tasks, never the bare folders: {bare}"


def test_no_import_circle() -> None:
    modules = _modules()
    graph = {name: _imported(name, path, modules) for name, path in modules.items()}
    circles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        trail.append(name)
        for reached in sorted(graph[name]):
            if state.get(reached) == 1:
                circles.append([*trail[trail.index(reached) :], reached])
            elif reached not in state:
                visit(reached, trail)
        trail.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert not circles, f"import circles: {circles}"


def test_only_actonce_is_installed(tmp_path: Path) -> None:
    # From a folder of its own, so the checkout's folders are not on the path.
    probe = (
        "import importlib.util as u; "
        "print(sorted(n for n in ('worker', 'tasks', 'demo', 'bench', 'lab') if u.find_spec(n)))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert found.stdout.strip() == "[]", found.stdout
