"""A worker or dispatcher that cannot go on exits non-zero, with one last line saying why.

`restart: on-failure` and systemd restart a process only when it fails: a real `actonce worker`
and a real `actonce dispatch`, whose broker is a port nothing listens on, must end with status 1
once their retries are spent, and the last line they write must say why.
"""

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from actonce.worker.definition import load_definition
from actonce.worker.migrate import migrate
from actonce.worker.runtime import Runtime
from actonce.worker.settings import Settings
from demo.definition import WorkRequested
from demo.feed import prepare, request_work
from lab.processes import environment, free_port

pytestmark = pytest.mark.slow


@pytest.fixture
def gone_broker_env(tmp_path: Path) -> dict[str, str]:
    """Settings over migrated SQLite stores, whose broker is a port nobody listens on."""
    env = {
        "ACTONCE_VAR_DIR": str(tmp_path / "var"),
        "ACTONCE_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0",
        "ACTONCE_BROKER_MAX_RETRIES": "1",
        "ACTONCE_DISPATCHER_MAX_FAILED_POLLS": "2",
        "ACTONCE_POLL_INTERVAL_S": "0.1",
    }
    asyncio.run(migrate(Settings.from_env(env)))
    return env


def run(env: dict[str, str], *arguments: str) -> subprocess.CompletedProcess[str]:
    """Run `actonce` with `arguments` to its end, as its supervisor would."""
    return subprocess.run(
        [sys.executable, "-m", "actonce.worker.cli", *arguments],
        env=environment(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_worker_whose_broker_is_gone_beyond_its_retries_exits_1_saying_why(
    gone_broker_env: dict[str, str],
) -> None:
    ended = run(gone_broker_env, "worker", "-c", "1")

    assert ended.returncode == 1, ended.stderr[-3000:]
    last = ended.stderr.strip().splitlines()[-1]
    assert last.startswith("actonce worker stopped with status 1: "), last
    assert "connecting to 127.0.0.1" in last, last


def test_a_dispatcher_that_cannot_send_exits_1_saying_why(
    gone_broker_env: dict[str, str],
) -> None:
    # Given a run due to be sent
    settings = Settings.from_env(gone_broker_env)
    runtime = Runtime(settings, load_definition(settings.app), one_run=False).open()
    try:
        runtime.run(prepare(runtime.artifactr, "acme", "ws_exit"))
        runtime.run(request_work(runtime.reflexr, "acme", "ws_exit", WorkRequested(key="exit")))
    finally:
        runtime.close()

    # When the dispatcher runs, with its broker gone
    ended = run(gone_broker_env, "dispatch")

    # Then its polls fail, and after two in a row it exits 1 with one line saying why
    assert ended.returncode == 1, ended.stderr[-3000:]
    last = ended.stderr.strip().splitlines()[-1]
    assert last.startswith("actonce dispatch stopped with status 1: 2 polls in a row failed"), last
