"""`make run`, the README's first command, as a user types it: on SQLite stores and a Redis
that answers, it feeds its runs, reports them settled with no duplicate write, and leaves no
process behind; Ctrl-C while it feeds stops everything it started, in one line, no traceback.
"""

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import psutil
import pytest
import redis

from lab.processes import environment
from lab.redis import RedisHandle

pytestmark = pytest.mark.slow

ROOT: Final = Path(__file__).resolve().parents[2]
"""The checkout, where `make` runs."""

REPORT: Final = re.compile(
    r"^settled: runs=7 succeeded=6 retried=\d+ dead=1 writes=\d+ duplicates=0$"
)
"""The report of six fed runs and the chat message's: one dead by design (`needs`)."""


@pytest.fixture
def demo_env(redis_server: RedisHandle, tmp_path: Path) -> Iterator[dict[str, str]]:
    """What a user's shell gives `make run`: a Redis that answers, and a var folder of its own."""
    url = redis_server.url.rsplit("/", 1)[0] + "/0"
    var_dir = str(tmp_path / "var")
    yield {"REDIS_URL": url, "ACTONCE_VAR_DIR": var_dir}
    # A test that failed may have left the demo running: nothing it started outlives the test.
    for process in _started_by(var_dir):
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()


def _make_run(env: dict[str, str], log: Path) -> "subprocess.Popen[bytes]":
    with open(log, "wb") as out:
        return subprocess.Popen(
            ["make", "--no-print-directory", "run"],
            cwd=ROOT,
            env=environment(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal's foreground job
            preexec_fn=_signals_as_a_terminal_leaves_them,
        )


def _signals_as_a_terminal_leaves_them() -> None:
    """Give Ctrl-C's signals their defaults in `make run`, as a terminal's foreground job has
    them: a test run started in the background of a non-interactive shell inherits SIGINT and
    SIGQUIT ignored, and make and Python keep an ignored SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _started_by(var_dir: str) -> list[psutil.Process]:
    """The processes running with `var_dir` as their ACTONCE_VAR_DIR: what a demo started."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("ACTONCE_VAR_DIR") == var_dir:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _gone(var_dir: str, timeout_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while (left := _started_by(var_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_make_run_feeds_its_runs_reports_them_settled_and_leaves_nothing_running(
    demo_env: dict[str, str], tmp_path: Path
) -> None:
    # When a user runs `make run`, asking it to exit once settled, with six runs
    log = tmp_path / "make-run.log"
    env = {**demo_env, "ACTONCE_EXIT_WHEN_SETTLED": "1", "ACTONCE_DEMO_RUNS": "6"}
    done = _make_run(env, log)
    code = done.wait(timeout=240)
    output = log.read_text()
    # Then it exits 0 on its report, with no duplicate write, on the Redis that answered
    assert code == 0, output
    assert REPORT.match(output.strip().splitlines()[-1]), output
    assert f"actonce demo: redis: {demo_env['REDIS_URL']}" in output, output
    assert "Traceback" not in output, output
    # and its stores are SQLite files in its var folder
    var = Path(demo_env["ACTONCE_VAR_DIR"])
    assert {"reflexr.db", "artifactr.db", "relayr.db", "actonce.db"} <= {
        p.name for p in var.iterdir()
    }, list(var.iterdir())
    # and none of the processes it started is left
    assert not _gone(demo_env["ACTONCE_VAR_DIR"], 30)


def test_ctrl_c_while_it_feeds_stops_everything_it_started(
    demo_env: dict[str, str], tmp_path: Path
) -> None:
    # Given `make run` feeding 300 runs, its pool, dispatcher and Flower running
    log = tmp_path / "make-run.log"
    running = _make_run({**demo_env, "ACTONCE_DEMO_RUNS": "300"}, log)
    deadline = time.monotonic() + 120
    while "feeding 300 runs" not in log.read_text():
        assert running.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    started = _started_by(demo_env["ACTONCE_VAR_DIR"])
    commands = " ".join(" ".join(p.cmdline()) for p in started)
    assert "dispatch" in commands and "worker" in commands and "flower" in commands, commands
    # When the user presses Ctrl-C: SIGINT to the foreground process group
    os.killpg(running.pid, signal.SIGINT)
    running.wait(timeout=60)
    # Then the demo says it stopped everything, in one line, with no traceback
    output = log.read_text()
    assert "actonce demo: interrupted: stopped everything this demo started" in output, output
    assert "Traceback" not in output, output
    # and every process it started is gone
    assert not _gone(demo_env["ACTONCE_VAR_DIR"], 30)
