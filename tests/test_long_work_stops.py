"""Long work stops whole: SIGTERM to `python -m bench.chaos` (as a supervisor or a CI time limit
sends it), or Ctrl-C to `python -m bench.soak` (SIGINT to its process group, as a terminal sends
it), ends every process the harness started (the workers and their children, the dispatcher,
the private Redis, an embedded PostgreSQL) and exits nonzero."""

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from bench_runs import ROOT

from lab.postgres import POSTGRES_URL_VARIABLE, PostgresHandle

MARK = "LONG_WORK_TEST_MARK"
"""Not an `ACTONCE_*` setting the lab passes on: `lab.processes.environment` drops those."""

UP_TIMEOUT_S = 180.0
"""How long the harness has to start its servers and pool and show its first progress line."""

GONE_TIMEOUT_S = 60.0
"""How long the harness has, after the signal, to stop what it started and exit."""


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    ("module", "signum", "to_group"),
    [("bench.chaos", signal.SIGTERM, False), ("bench.soak", signal.SIGINT, True)],
    ids=["chaos-sigterm", "soak-ctrl-c"],
)
def test_a_signal_stops_long_work_and_everything_it_started(
    tmp_path: Path,
    postgres_server: PostgresHandle,
    module: str,
    signum: signal.Signals,
    to_group: bool,
) -> None:
    # Given a harness at work on 100,000 runs, with a mark in its environment that every
    # process it starts inherits (chaos starts its own embedded PostgreSQL; the soak makes
    # its database on the suite's server)
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark, POSTGRES_URL_VARIABLE: postgres_server.admin_dsn}
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "wb") as stderr:
        harness = subprocess.Popen(
            [sys.executable, "-m", module, "--runs", "100000", "--out", str(tmp_path / "o.json")],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        # When its pool is up (its first progress line says so) and it is feeding
        label = module.removeprefix("bench.")
        _wait_for(
            lambda: (
                f"{label}: " in stderr_path.read_text(errors="replace")
                or harness.poll() is not None
            ),
            UP_TIMEOUT_S,
            "the first progress line",
        )
        assert harness.poll() is None, stderr_path.read_text(errors="replace")[-3000:]
        started = _started(harness.pid, mark)
        names = sorted({p.name() for p in started})
        # a worker and its 2 children, the dispatcher, Redis (and chaos's turn worker and
        # PostgreSQL's own processes)
        assert len(started) >= 5, names
        assert any("redis" in name for name in names), names
        if module == "bench.chaos":  # its own embedded PostgreSQL
            assert "postgres" in names, names

        # and it gets the signal
        if to_group:
            os.killpg(harness.pid, signum)
        else:
            harness.send_signal(signum)

        # Then it exits nonzero, and every process it started is gone
        status = harness.wait(timeout=GONE_TIMEOUT_S)
        tail = stderr_path.read_text(errors="replace")[-3000:]
        assert status == 128 + signum, (status, tail)
        assert "what it started is stopped" in tail, tail
        _wait_for(lambda: not _alive(started), 15.0, "every started process gone")
        assert not _started(harness.pid, mark), tail
    finally:
        # What a failure left behind, found while the harness still holds its children
        left = _started(harness.pid, mark)
        if harness.poll() is None:
            os.killpg(harness.pid, signal.SIGKILL)
            harness.wait()
        for process in left:
            with contextlib.suppress(psutil.Error):
                process.kill()


def _started(harness: int, mark: str) -> list[psutil.Process]:
    """Every live process (not a zombie) the harness started: its descendants, and those
    whose environment carries `mark` (an embedded PostgreSQL's postmaster has left the tree:
    `pg_ctl` started it; Redis rewrites its environment's memory with its title, but stays a
    child)."""
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        found.update((p.pid, p) for p in psutil.Process(harness).children(recursive=True))
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.pid != harness and process.environ().get(MARK) == mark:
                found[process.pid] = process
    return _alive(list(found.values()))


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.Error:
            continue
    return alive


def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.2)
