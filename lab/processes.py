"""Subprocesses of the lab: their environment, how they end, and what CPU they used.

Every process the lab starts gets a session of its own, so one signal to its group reaches the
children it forked (a prefork worker's pool) too. CPU figures come from psutil, so they read the
same on Linux and macOS. Long work (`make chaos`, `make soak`, `make bench`) runs under
`run_stoppable`, so Ctrl-C or a supervisor's SIGTERM stops everything it started.
"""

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Final

import psutil

STOP_GRACE_S: Final = 10.0
"""How long a lab process has after SIGTERM (a warm shutdown) before it gets SIGKILL."""


def environment(settings_env: Mapping[str, str]) -> dict[str, str]:
    """Return this process's environment without its `ACTONCE_*` and `REDIS_URL`, then
    `settings_env` on top: what a lab process runs on is exactly what its caller says."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("ACTONCE_") and key != "REDIS_URL"
    }
    env.update(settings_env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def free_port() -> int:
    """Return a TCP port on the loopback that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """Return the user and system CPU seconds process `pid` has used (0.0 if it is gone)."""
    try:
        used = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(used.user + used.system)


def children(pid: int) -> list[int]:
    """Return the pids of the direct children of process `pid` (none if it is gone)."""
    try:
        return [kid.pid for kid in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def signal_group(process: "subprocess.Popen[bytes]", signum: int) -> None:
    """Send `signum` to the process group of a process the lab started, if it is still there."""
    # Each process was started in a session of its own, so its group id is its pid.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def end(process: "subprocess.Popen[bytes]", *, grace_s: float) -> None:
    """SIGTERM a process's group, then SIGKILL it if it is still there after `grace_s`."""
    signal_group(process, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        signal_group(process, signal.SIGKILL)
        process.wait()


class Stopped(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM or SIGINT while `stopping_on_signals` is in force.

    A `KeyboardInterrupt`, so what lets Ctrl-C through (`except Exception`) lets it through too,
    and every `with` block and `finally` clause on the way out runs.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_status(self) -> int:
        """128 plus the signal's number, as a shell reports a process a signal ended."""
        return 128 + self.signum


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[list[Stopped]]:
    """Stop the main thread's work on the first SIGTERM or SIGINT while in the block; yield
    a list that then holds the `Stopped`.

    Python's default ends a process on SIGTERM without unwinding it, so the workers, Redis and
    PostgreSQL it started were left running. Outside an event loop the signal raises `Stopped`.
    Inside one (the harness's runtime, `asyncio.run`) it cancels every task of the loop
    instead, so each coroutine's `finally` clauses run in order and `asyncio.CancelledError`
    leaves the loop: an exception raised between two steps would leave tasks suspended, and a
    loop closed on them hangs. Any later SIGTERM or SIGINT is ignored until the block ends: a
    second Ctrl-C must not cut the stopping short. The handlers found are put back on leaving.
    Call it from the main thread only (where Python runs signal handlers).
    """
    signalled: list[Stopped] = []

    def stop(signum: int, _: FrameType | None) -> None:
        if signalled:
            return
        signalled.append(Stopped(signum))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise signalled[0] from None
        for task in asyncio.all_tasks(loop):
            task.cancel()

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield signalled
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_stoppable(main: Callable[[], int], label: str) -> int:
    """Run `main` under `stopping_on_signals`; return its exit status, or the signal's
    (`Stopped.exit_status`, nonzero) once everything it started has stopped."""
    with stopping_on_signals() as signalled:
        try:
            status = main()
        except (Stopped, asyncio.CancelledError):
            if not signalled:
                raise
        if not signalled:
            return status
        print(f"{label}: {signalled[0]}; what it started is stopped", file=sys.stderr, flush=True)
        return signalled[0].exit_status
