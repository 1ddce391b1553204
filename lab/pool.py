"""A local pool as subprocesses: `actonce worker` processes and one dispatcher.

The tests, the demo and the benchmark and chaos harness run the pool the way an operator would,
as real processes on this machine, with no docker: `LocalPool` starts prefork workers and a
dispatcher with a given `ACTONCE_*` environment, logging each to its own file, and stops them
all, always.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from celery import Celery

from lab.processes import STOP_GRACE_S, children, cpu_seconds, environment, signal_group


class PoolNotReady(RuntimeError):
    """Raised when the pool's processes did not come up in time, or one of them exited."""


class LocalPool:
    """`workers` `actonce worker` processes and one `actonce dispatch`, as subprocesses.

    Each process gets this process's environment without its `ACTONCE_*` and `REDIS_URL`
    variables, then `settings_env` on top, so what the pool runs on is exactly what the caller
    says. Each logs to `<log_dir>/<name>.log`. Use it as a context manager, or call `start` and
    `stop`; `stop` always ends every process it started, children included.

    Args:
        settings_env: The `ACTONCE_*` variables of the pool: at least `ACTONCE_BROKER_URL`, and
            `ACTONCE_VAR_DIR` or `ACTONCE_DATABASE_URL`. The stores must be migrated already.
        workers: How many `actonce worker` processes to start.
        concurrency: Prefork children per worker, or attempts in flight with threads (`-c`).
        pool: Each worker's pool (`-P`): `prefork` or `threads`; None passes no `-P`, so the
            worker takes `ACTONCE_POOL` from `settings_env`.
        log_dir: Where the processes' logs go; a temporary directory if None.
        dispatcher: Whether to start the dispatcher too.
        loglevel: The workers' Celery log level.
        turn_workers: How many `actonce worker -Q actonce.turns` processes to start, named
            `turns<i>`, with `turn_concurrency` children each; with any, the `workers` serve
            `actonce.attempts` only, as the operations docs recommend when rules send. With none,
            the workers serve both queues.
        turn_concurrency: Prefork children per turn worker.
    """

    def __init__(
        self,
        settings_env: Mapping[str, str],
        *,
        workers: int,
        concurrency: int,
        pool: str | None = "prefork",
        log_dir: Path | None = None,
        dispatcher: bool = True,
        loglevel: str = "INFO",
        turn_workers: int = 0,
        turn_concurrency: int = 1,
    ) -> None:
        if workers < 1 or concurrency < 1 or turn_workers < 0 or turn_concurrency < 1:
            raise ValueError(
                f"workers and concurrency must be 1 or more, not {workers}, {concurrency}; "
                f"turn_workers 0 or more and turn_concurrency 1 or more, not {turn_workers}, "
                f"{turn_concurrency}"
            )
        self.settings_env = dict(settings_env)
        self.workers = workers
        self.concurrency = concurrency
        self.pool = pool
        self.turn_workers = turn_workers
        self.turn_concurrency = turn_concurrency
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="actonce-pool-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._with_dispatcher = dispatcher
        self._loglevel = loglevel
        self._tag = f"{os.getpid()}x{time.monotonic_ns() % 1_000_000}"
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._reviving = threading.Lock()
        self._celery: Celery | None = None

    @property
    def hostnames(self) -> list[str]:
        """The workers' Celery node names, `actonce<i>-<tag>@<this host>`, then the turn
        workers', `turns<i>-<tag>@<this host>`."""
        host = socket.gethostname()
        return [f"actonce{i}-{self._tag}@{host}" for i in range(self.workers)] + [
            f"turns{i}-{self._tag}@{host}" for i in range(self.turn_workers)
        ]

    @property
    def celery(self) -> Celery:
        """A Celery app on the pool's broker and result backend, for control and results."""
        if self._celery is None:
            from actonce.worker.app import make_celery
            from actonce.worker.settings import Settings

            self._celery = make_celery(Settings.from_env(self.settings_env))
        return self._celery

    def start(self) -> Self:
        """Start the workers and the dispatcher; return at once (see `wait_ready`)."""
        for name, arguments in self._commands().items():
            self._spawn(name, *arguments)
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until every worker answers a Celery ping and the dispatcher says it dispatches.

        Raises:
            PoolNotReady: If a process exited, or not all answered within `timeout_s`; the
                message names them and the logs to read.
        """
        deadline = time.monotonic() + timeout_s
        waiting = set(self.hostnames)
        while time.monotonic() < deadline:
            self._check_alive()
            if waiting:
                replies = self.celery.control.ping(timeout=0.5) or []
                for reply in replies:
                    waiting -= set(reply)
            dispatching = not self._with_dispatcher or "dispatching to" in self.log("dispatcher")
            if not waiting and dispatching:
                return
            time.sleep(0.2)
        raise PoolNotReady(
            f"not ready after {timeout_s}s: workers {sorted(waiting)} did not answer a ping"
            f" (dispatcher ready: {'dispatching to' in self.log('dispatcher')}); "
            f"see the logs in {self.log_dir}"
        )

    def worker_children(self) -> dict[int, list[int]]:
        """Return each worker's pid with the pids of its prefork children (turn workers left
        out: see `pid`)."""
        return {
            process.pid: children(process.pid)
            for name, process in self._processes.items()
            if name.startswith("worker") and process.poll() is None
        }

    def cpu_seconds(self) -> dict[str, float]:
        """Return the CPU seconds used so far by the dispatcher, the Celery workers' main
        processes and their prefork children (a child that exited is not counted).
        """
        used = {"dispatcher": 0.0, "worker": 0.0, "children": 0.0}
        for name, process in self._processes.items():
            if process.poll() is not None:
                continue
            if name == "dispatcher":
                used["dispatcher"] += cpu_seconds(process.pid)
            elif name.startswith("worker"):
                used["worker"] += cpu_seconds(process.pid)
                used["children"] += sum(cpu_seconds(kid) for kid in children(process.pid))
        return used

    def kill_worker_child(
        self,
        signum: int = signal.SIGKILL,
        *,
        run_id: str | None = None,
        workspace_id: str | None = None,
        timeout_s: float = 10.0,
    ) -> int:
        """Send `signum` to the child attempting `run_id` (or any busy child); return its pid.

        Run ids are derived from a rule and its events, so the same id may exist in several
        workspaces: give `workspace_id` too when it matters. The child is found through Celery's
        `inspect().active()`, which names the pid running each task, and checked to be a child
        of one of this pool's workers.

        Raises:
            PoolNotReady: If no such child is running a task within `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ours = {pid for kids in self.worker_children().values() for pid in kids}
            active = self.celery.control.inspect(timeout=1.0).active() or {}
            for tasks in active.values():
                for task in tasks:
                    kwargs = task.get("kwargs") or {}
                    pid = task.get("worker_pid")
                    if pid not in ours or not _names(kwargs, run_id, workspace_id):
                        continue
                    os.kill(pid, signum)
                    return int(pid)
            time.sleep(0.2)
        raise PoolNotReady(f"no worker child was attempting {run_id or 'anything'} in {timeout_s}s")

    def kill_worker(self, index: int = 0, signum: int = signal.SIGKILL) -> int:
        """Send `signum` to worker `index`'s whole process group; return the worker's pid.

        What a crashed or OOM-killed host does to a `threads` worker: every attempt it had in
        flight dies with it. `revive` starts it again.

        Raises:
            PoolNotReady: If that worker is not running.
        """
        process = self._processes.get(f"worker{index}")
        if process is None or process.poll() is not None:
            raise PoolNotReady(f"worker{index} is not running")
        signal_group(process, signum)
        process.wait()
        return process.pid

    def pid(self, name: str) -> int | None:
        """Return the pid of process `name` (`worker0`, `turns0`, `dispatcher`) while it runs."""
        process = self._processes.get(name)
        return process.pid if process is not None and process.poll() is None else None

    def stop_process(self, name: str, timeout_s: float) -> bool:
        """Stop process `name` with a warm shutdown (SIGTERM: a Celery worker finishes the tasks
        it runs and gives back those it holds), SIGKILLing its group if it is not gone within
        `timeout_s`; return whether it stopped warm. `revive` starts it again.
        """
        process = self._processes[name]
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
            warm = True
        except subprocess.TimeoutExpired:
            warm = False
        signal_group(process, signal.SIGKILL)  # children a warm shutdown left behind
        process.wait()
        return warm

    def log(self, name: str) -> str:
        """Return what process `name` (`worker0`, `dispatcher`…) has logged so far."""
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every process: SIGTERM to each, then SIGKILL to what is left after `grace_s`."""
        processes = list(self._processes.values())
        self._processes.clear()
        for process in processes:
            # The leader only: a worker's warm shutdown lets its children finish their attempts.
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            signal_group(process, signal.SIGKILL)  # the group: prefork children left behind
            process.wait()
        if self._celery is not None:
            self._celery.close()
            self._celery = None

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ─── how ──────────────────────────────────────────────────────────────────

    def revive(self, *, held: Collection[str] = ()) -> list[str]:
        """Start again every process of the pool that exited, but those `held` down; return
        their names.

        What a supervisor (compose's `restart: unless-stopped`, systemd) does in production: a
        Celery worker's main process can exit on a broker restart, and nothing else restarts it.
        """
        commands = self._commands()
        # Callers revive from threads of their own: two must never start one process twice.
        with self._reviving:
            exited = [
                name
                for name, process in self._processes.items()
                if process.poll() is not None and name not in held
            ]
            for name in exited:
                self._spawn(name, *commands[name])
        return exited

    def _commands(self) -> dict[str, tuple[str, ...]]:
        """The `actonce` arguments of each process of the pool, by its name."""
        # With turn workers of its own, an attempt worker serves attempts only.
        queues = ("-Q", "actonce.attempts") if self.turn_workers else ()
        hostnames = self.hostnames
        commands: dict[str, tuple[str, ...]] = {
            f"worker{i}": (
                "worker",
                *(("-P", self.pool) if self.pool is not None else ()),
                "-c",
                str(self.concurrency),
                "-n",
                hostnames[i],
                "--loglevel",
                self._loglevel,
                *queues,
            )
            for i in range(self.workers)
        }
        for i in range(self.turn_workers):
            commands[f"turns{i}"] = (
                "worker",
                "-c",
                str(self.turn_concurrency),
                "-n",
                hostnames[self.workers + i],
                "--loglevel",
                self._loglevel,
                "-Q",
                "actonce.turns",
            )
        if self._with_dispatcher:
            commands["dispatcher"] = ("dispatch",)
        return commands

    def _spawn(self, name: str, *arguments: str) -> None:
        with open(self.log_dir / f"{name}.log", "ab") as log_file:
            self._processes[name] = subprocess.Popen(
                [sys.executable, "-m", "actonce.worker.cli", *arguments],
                env=environment(self.settings_env),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so stop reaches its children
            )

    def _check_alive(self) -> None:
        for name, process in self._processes.items():
            if process.poll() is not None:
                tail = "\n".join(self.log(name).splitlines()[-15:])
                raise PoolNotReady(f"{name} exited with {process.returncode}:\n{tail}")


# ─── how ──────────────────────────────────────────────────────────────────────


def _names(kwargs: Mapping[str, Any], run_id: str | None, workspace_id: str | None) -> bool:
    return (run_id is None or kwargs.get("run_id") == run_id) and (
        workspace_id is None or kwargs.get("workspace_id") == workspace_id
    )
