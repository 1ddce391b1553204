"""Subprocesses of the lab: their environment, how they end, and what CPU they used.

Every process the lab starts gets a session of its own, so one signal to its group reaches the
children it forked (a prefork worker's pool) too. CPU figures come from psutil, so they read the
same on Linux and macOS.
"""

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Mapping
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
