"""The documented commands work from an application's folder that has its own `tasks.py`.

Celery applications very often keep a `tasks.py` (and sometimes a `worker.py`) of their own. An
actonce that installed top-level `tasks` or `worker` packages would import those instead and fail.
Here each documented command runs from such a folder, whose `tasks.py` and `worker.py` stop any
process that imports them: `actonce --help`, `python -m actonce.worker.cli`, `actonce migrate`, a
real prefork `actonce worker` answering `celery -A actonce.worker.app inspect ping`, and
`actonce dispatch --once`.
"""

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[2]
BIN: Final = Path(sys.executable).parent
TRAP: Final = 'raise SystemExit("actonce imported the application\'s own {name}")\n'

pytestmark = pytest.mark.slow


@pytest.fixture
def app_folder(tmp_path: Path) -> Path:
    """A folder with its own `tasks.py` and `worker.py`, and the demo's definition beside them."""
    folder = tmp_path / "app"
    folder.mkdir()
    for name in ("tasks.py", "worker.py"):
        (folder / name).write_text(TRAP.format(name=name))
    shutil.copytree(ROOT / "demo", folder / "demo", ignore=shutil.ignore_patterns("__pycache__"))
    return folder


@pytest.fixture
def environment(app_folder: Path, redis_server: object) -> dict[str, str]:
    """The pool's settings for the folder: its own SQLite stores and Redis database."""
    url = redis_server.url.rsplit("/", 1)[0] + "/5"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACTONCE_")}
    env.pop("PYTHONPATH", None)
    env.update(
        ACTONCE_BROKER_URL=url,
        ACTONCE_VAR_DIR=str(app_folder / "var"),
        ACTONCE_APP="demo.definition:app",
    )
    return env


def _run(folder: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def worker(app_folder: Path, environment: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """A real `actonce worker` started from the folder, stopped after the test."""
    migrated = _run(app_folder, environment, str(BIN / "actonce"), "migrate")
    assert migrated.returncode == 0, migrated.stderr
    process = subprocess.Popen(
        [str(BIN / "actonce"), "worker", "-c", "1", "-n", "foreign@localhost"],
        cwd=app_folder,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_help_works_from_a_folder_with_its_own_tasks_py(
    app_folder: Path, environment: dict[str, str]
) -> None:
    for argv in (
        [str(BIN / "actonce"), "--help"],
        [sys.executable, "-m", "actonce.worker.cli", "--help"],
        [str(BIN / "celery"), "-A", "actonce.worker.app", "inspect", "--help"],
    ):
        done = _run(app_folder, environment, *argv)
        assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
        assert "own tasks.py" not in done.stderr and "own worker.py" not in done.stderr


def test_a_worker_started_from_that_folder_answers_and_the_dispatcher_polls(
    app_folder: Path, environment: dict[str, str], worker: subprocess.Popen[str]
) -> None:
    ping = [str(BIN / "celery"), "-A", "actonce.worker.app", "inspect", "ping"]
    ping += ["-d", "foreign@localhost", "--timeout", "2"]
    deadline = time.monotonic() + 60
    while True:
        answered = _run(app_folder, environment, *ping)
        if answered.returncode == 0 and "pong" in answered.stdout:
            break
        if worker.poll() is not None or time.monotonic() > deadline:
            output = worker.stdout.read() if worker.stdout else ""
            pytest.fail(f"the worker never answered a ping: {answered.stderr}\n{output[-3000:]}")
        time.sleep(0.5)

    polled = _run(app_folder, environment, str(BIN / "actonce"), "dispatch", "--once")

    assert polled.returncode == 0, polled.stderr
    assert worker.poll() is None, "the worker exited"
