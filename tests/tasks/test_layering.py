"""tasks/ imports nothing from worker/, so an app can use `RunActions` in process.

Only `tasks/attempt.py` (the task and its settle step) and `tasks/turn_task.py` touch the worker's
app and runtime; every other module under tasks/ is parsed here and may not import `worker`.
"""

import ast
from pathlib import Path

TASKS = Path(__file__).resolve().parents[2] / "tasks"
ALLOWED = {"attempt.py", "turn_task.py"}
"""The modules that may import the worker: the Celery tasks themselves."""


def _imported(module: Path) -> set[str]:
    """Every module a file imports or imports from, by absolute name, relative imports resolved."""
    package = list(module.relative_to(TASKS.parent).parent.parts)
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(), filename=str(module))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            origin = ".".join([*base, *([node.module] if node.module else [])])
            names.add(origin)
            names.update(f"{origin}.{alias.name}".lstrip(".") for alias in node.names)
    return names


def test_the_layering_test_sees_the_act_once_core() -> None:
    modules = {path.name for path in TASKS.rglob("*.py")}
    assert {"outbound.py", "ids.py", "turns.py", "handles.py"} <= modules


def test_no_module_of_tasks_but_the_celery_tasks_imports_worker() -> None:
    reaching = {
        str(path.relative_to(TASKS.parent)): sorted(
            name
            for name in _imported(path)
            if name in ("worker", "actonce.worker")
            or name.startswith(("worker.", "actonce.worker."))
        )
        for path in sorted(TASKS.rglob("*.py"))
        if path.name not in ALLOWED
    }

    assert not {path: names for path, names in reaching.items() if names}, (
        "tasks/ must not import worker/: an app uses RunActions in process"
    )
