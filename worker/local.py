"""A local pool as subprocesses: a Redis, `actonce worker` processes and one dispatcher.

The tests, `actonce demo` and the benchmark and chaos harness all run the pool the way an
operator would, as real processes on this machine, with no docker: `find_or_start_redis` uses a
Redis that answers or starts a private `redis-server` on a free loopback port (never touching the
machine's own databases), and `LocalPool` starts prefork workers and a dispatcher with a given
`ACTONCE_*` environment, logging each to its own file, and stops them all, always.

"Exactly once" is checked from artifactr itself: `artifactr_census` reads a workspace's log and
counts each message, artifact, proposal and applied edit by its id, and `wait_settled` polls
reflexr until a workspace's runs have all finished.
"""

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import artifactr
import asyncpg
import redis
import reflexr.workspace as rw
from celery import Celery
from reflexr.core import Run

TERMINAL: Final = frozenset({"succeeded", "dead", "cancelled", "skipped"})
"""The statuses of a run that will not change again unless an operator replays it."""

REDIS_START_TIMEOUT_S: Final = 10.0
"""How long a private `redis-server` has to answer PING after it is started."""

STOP_GRACE_S: Final = 10.0
"""How long `LocalPool.stop` waits after SIGTERM (a warm shutdown) before it sends SIGKILL."""

HOW_TO_GET_REDIS: Final = (
    "install it (`apt-get install redis-server`, or `brew install redis`) so a private one can "
    "be started, or set REDIS_URL to a Redis that answers"
)
"""What an error about a missing Redis tells the reader to do."""


POSTGRES_ADMIN_DSN: Final = "postgresql://postgres@127.0.0.1:5432/postgres"
"""The machine's PostgreSQL server (trust auth), reached through its `postgres` database."""

POSTGRES_CONNECT_TIMEOUT_S: Final = 5.0
"""How long making or dropping a database waits for PostgreSQL before it counts unreachable."""


class PostgresUnreachable(RuntimeError):
    """Raised when no database can be created on the machine's PostgreSQL."""


@contextlib.contextmanager
def fresh_postgres_database(prefix: str) -> Iterator[str]:
    """Yield the SQLAlchemy URL of a new, empty PostgreSQL database, dropped afterwards.

    The database is `<prefix>_<random hex>` on the server of `POSTGRES_ADMIN_DSN`, dropped
    `WITH (FORCE)` so connections left open do not keep it.

    Raises:
        PostgresUnreachable: If the database cannot be created.
    """
    name = f"{prefix}_{secrets.token_hex(6)}"
    try:
        asyncio.run(_postgres_admin(f'CREATE DATABASE "{name}"'))
    except (OSError, TimeoutError, asyncpg.PostgresError) as unreachable:
        raise PostgresUnreachable(
            f"cannot create a database on PostgreSQL at {POSTGRES_ADMIN_DSN}: {unreachable!r}"
        ) from unreachable
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
    finally:
        asyncio.run(_postgres_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


class RedisUnavailable(RuntimeError):
    """Raised when no Redis answers and no private `redis-server` can be started."""


class PoolNotReady(RuntimeError):
    """Raised when the pool's processes did not come up in time, or one of them exited."""


class RedisHandle:
    """A Redis the pool uses: either found (not ours to stop) or a private server we started.

    Args:
        url: The Redis URL, database 0 of a private server.
        process: The private server's process, or None for a found one.
        port: The private server's port.
        directory: The private server's working directory, removed by `stop`.
    """

    def __init__(
        self,
        url: str,
        *,
        process: "subprocess.Popen[bytes] | None" = None,
        port: int | None = None,
        directory: Path | None = None,
    ) -> None:
        self.url = url
        self._process = process
        self._port = port
        self._directory = directory

    @property
    def owned(self) -> bool:
        """Whether this handle started the server, and so may stop and restart it."""
        return self._process is not None

    @property
    def pid(self) -> int | None:
        """The private server's pid; None for a found one."""
        return None if self._process is None else self._process.pid

    def stop(self) -> None:
        """Stop a private server and remove its directory; a found one is left alone."""
        if self._process is None:
            return
        _end(self._process, grace_s=3.0)
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)

    def restart(self) -> None:
        """Kill a private server and start it again on the same port, empty (for chaos tests).

        Raises:
            RedisUnavailable: If this Redis was found, not started here, or does not come back.
        """
        if self._process is None or self._port is None or self._directory is None:
            raise RedisUnavailable(f"{self.url} was not started here; it cannot be restarted")
        self._process.kill()
        self._process.wait()
        self._process = _start_redis_server(self._port, self._directory)
        _wait_for_ping(self.url, self._process)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def find_or_start_redis(url: str | None, *, directory: Path | None = None) -> RedisHandle:
    """Return a handle on a Redis that answers: `url` if it does, else a private server.

    A private server listens on a free loopback port, saves nothing (`--save "" --appendonly no`)
    and keeps its files in a directory of its own, made under `directory` (or the system's temp
    directory) and removed when it stops. Pass None to always start a private one, as tests do,
    so they never touch the databases of the machine's Redis.

    Raises:
        RedisUnavailable: If `url` does not answer and `redis-server` cannot be started; the
            message says how to get Redis.
    """
    if url and _answers(url):
        return RedisHandle(url)
    if shutil.which("redis-server") is None:
        tried = f"{url} does not answer PING and " if url else ""
        raise RedisUnavailable(f"{tried}redis-server is not on PATH: {HOW_TO_GET_REDIS}")
    problem: Exception | None = None
    for _ in range(3):  # a free port can be taken between choosing and binding it
        port = free_port()
        home = Path(tempfile.mkdtemp(prefix=f"actonce-redis-{port}-", dir=directory))
        process = _start_redis_server(port, home)
        handle = RedisHandle(
            f"redis://127.0.0.1:{port}/0", process=process, port=port, directory=home
        )
        try:
            _wait_for_ping(handle.url, process)
        except RedisUnavailable as failed:
            handle.stop()
            problem = failed
            continue
        return handle
    raise RedisUnavailable(f"could not start a private redis-server: {problem}; {HOW_TO_GET_REDIS}")


class LocalPool:
    """`workers` prefork `actonce worker` processes and one `actonce dispatch`, as subprocesses.

    Each process gets this process's environment without its `ACTONCE_*` and `REDIS_URL`
    variables, then `settings_env` on top, so what the pool runs on is exactly what the caller
    says. Each logs to `<log_dir>/<name>.log`. Use it as a context manager, or call `start` and
    `stop`; `stop` always ends every process it started, children included.

    Args:
        settings_env: The `ACTONCE_*` variables of the pool: at least `ACTONCE_BROKER_URL`, and
            `ACTONCE_VAR_DIR` or `ACTONCE_DATABASE_URL`. The stores must be migrated already.
        workers: How many `actonce worker` processes to start.
        concurrency: Prefork children per worker (`-c`).
        log_dir: Where the processes' logs go; a temporary directory if None.
        dispatcher: Whether to start the dispatcher too.
        loglevel: The workers' Celery log level.
    """

    def __init__(
        self,
        settings_env: Mapping[str, str],
        *,
        workers: int,
        concurrency: int,
        log_dir: Path | None = None,
        dispatcher: bool = True,
        loglevel: str = "INFO",
    ) -> None:
        if workers < 1 or concurrency < 1:
            raise ValueError(
                f"workers and concurrency must be 1 or more, not {workers}, {concurrency}"
            )
        self.settings_env = dict(settings_env)
        self.workers = workers
        self.concurrency = concurrency
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="actonce-pool-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._with_dispatcher = dispatcher
        self._loglevel = loglevel
        self._tag = f"{os.getpid()}x{time.monotonic_ns() % 1_000_000}"
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._celery: Celery | None = None

    @property
    def hostnames(self) -> list[str]:
        """The workers' Celery node names, `actonce<i>-<tag>@<this host>`."""
        return [f"actonce{i}-{self._tag}@{socket.gethostname()}" for i in range(self.workers)]

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
        """Return each worker's pid with the pids of its prefork children."""
        return {
            process.pid: _children(process.pid)
            for name, process in self._processes.items()
            if name.startswith("worker") and process.poll() is None
        }

    def cpu_seconds(self) -> dict[str, float]:
        """Return the CPU seconds used so far by the dispatcher, the Celery workers' main
        processes and their prefork children (Linux `/proc`; a child that exited is not counted).
        """
        used = {"dispatcher": 0.0, "worker": 0.0, "children": 0.0}
        for name, process in self._processes.items():
            if process.poll() is not None:
                continue
            if name == "dispatcher":
                used["dispatcher"] += cpu_seconds(process.pid)
            elif name.startswith("worker"):
                used["worker"] += cpu_seconds(process.pid)
                used["children"] += sum(cpu_seconds(kid) for kid in _children(process.pid))
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
            _signal_group(process, signal.SIGKILL)  # the group: prefork children left behind
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

    def revive(self) -> list[str]:
        """Start again every process of the pool that exited; return their names.

        What a supervisor (compose's `restart: unless-stopped`, systemd) does in production: a
        Celery worker's main process can exit on a broker restart, and nothing else restarts it.
        """
        commands = self._commands()
        exited = [name for name, process in self._processes.items() if process.poll() is not None]
        for name in exited:
            self._spawn(name, *commands[name])
        return exited

    def _commands(self) -> dict[str, tuple[str, ...]]:
        """The `actonce` arguments of each process of the pool, by its name."""
        commands: dict[str, tuple[str, ...]] = {
            f"worker{i}": (
                "worker",
                "-c",
                str(self.concurrency),
                "-n",
                hostname,
                "--loglevel",
                self._loglevel,
            )
            for i, hostname in enumerate(self.hostnames)
        }
        if self._with_dispatcher:
            commands["dispatcher"] = ("dispatch",)
        return commands

    def _spawn(self, name: str, *arguments: str) -> None:
        with open(self.log_dir / f"{name}.log", "ab") as log_file:
            self._processes[name] = subprocess.Popen(
                [sys.executable, "-m", "actonce.worker.cli", *arguments],
                env=_environment(self.settings_env),
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


@contextlib.contextmanager
def flower(
    settings_env: Mapping[str, str], *, port: int, log_file: Path
) -> Iterator["subprocess.Popen[bytes]"]:
    """Run Flower on the loopback `port` against the pool's broker, and stop it afterwards.

    Its HTTP API is open (`FLOWER_UNAUTHENTICATED_API`): it listens on 127.0.0.1 only. It sees
    task events live only, so start it before the attempts it should show.
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "actonce.worker.app",
                "flower",
                f"--port={port}",
                "--address=127.0.0.1",
            ],
            env={**_environment(settings_env), "FLOWER_UNAUTHENTICATED_API": "true"},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        _end(process, grace_s=STOP_GRACE_S)


@dataclass(frozen=True)
class Census:
    """What an artifactr workspace holds, counted from its log: each id should appear once."""

    messages: Counter[str] = field(default_factory=Counter)
    """`message_posted` events by message id (notices and messages alike)."""

    artifacts: Counter[str] = field(default_factory=Counter)
    """`artifact_created` events by artifact id."""

    proposals: Counter[str] = field(default_factory=Counter)
    """`proposal_created` events by proposal id."""

    changes: Counter[str] = field(default_factory=Counter)
    """`artifact_changed` events (applied edits) by artifact id."""

    edits: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Applied edits by (artifact id, JSON Pointer) of each operation they applied."""

    def duplicates(self) -> dict[str, list[object]]:
        """Return the ids made more than once, by kind; empty when every write landed once."""
        found: dict[str, list[object]] = {}
        for kind in ("messages", "artifacts", "proposals", "edits"):
            counter: Counter[Any] = getattr(self, kind)
            twice = sorted(key for key, count in counter.items() if count > 1)
            if twice:
                found[kind] = twice
        return found


async def artifactr_census(workspace: artifactr.Workspace) -> Census:
    """Return the census of an opened artifactr workspace, read from its whole log."""
    census = Census()
    for envelope in await workspace.read():
        event: Any = envelope.event
        kind = getattr(event, "type", None)
        if kind == "message_posted":
            census.messages[event.message_id] += 1
        elif kind == "artifact_created":
            census.artifacts[event.artifact_id] += 1
        elif kind == "proposal_created":
            census.proposals[event.proposal_id] += 1
        elif kind == "artifact_changed":
            census.changes[event.artifact_id] += 1
            for pointer in _operations(event.patch):
                census.edits[(event.artifact_id, pointer)] += 1
    return census


async def wait_settled(
    workspace: rw.Workspace,
    *,
    runs: int = 1,
    timeout_s: float = 60.0,
    poll_s: float = 0.2,
) -> list[Run]:
    """Poll an opened reflexr workspace until it has `runs` runs, all finished; return them.

    Finished means `succeeded`, `dead`, `cancelled` or `skipped`. After `timeout_s` it returns
    the runs as they are, so the caller's assertion says what was still going on.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        found = await workspace.runs()
        settled = len(found) >= runs and all(run.status in TERMINAL for run in found)
        if settled or time.monotonic() >= deadline:
            return list(found)
        await asyncio.sleep(poll_s)


# ─── how ──────────────────────────────────────────────────────────────────────


def _operations(patch: Any) -> list[str]:
    # A JSON Patch names the pointer of each operation; a text edit changes the artifact's body.
    operations = getattr(patch, "ops", None)
    if operations is None:
        return [f"<{getattr(patch, 'kind', 'edit')}>"]
    return [str(operation.get("path")) for operation in operations]


def _names(kwargs: Mapping[str, Any], run_id: str | None, workspace_id: str | None) -> bool:
    return (run_id is None or kwargs.get("run_id") == run_id) and (
        workspace_id is None or kwargs.get("workspace_id") == workspace_id
    )


def _answers(url: str) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=1.0)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError):
        return False


async def _postgres_admin(statement: str) -> None:
    connection = await asyncpg.connect(POSTGRES_ADMIN_DSN, timeout=POSTGRES_CONNECT_TIMEOUT_S)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


def _environment(settings_env: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without its `ACTONCE_*` and `REDIS_URL`, then `settings_env`."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("ACTONCE_") and key != "REDIS_URL"
    }
    environment.update(settings_env)
    environment.setdefault("PYTHONUNBUFFERED", "1")
    return environment


def free_port() -> int:
    """Return a TCP port on the loopback that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_redis_server(port: int, home: Path) -> "subprocess.Popen[bytes]":
    with open(home / "redis.log", "ab") as log_file:
        return subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(home),
            ],
            cwd=home,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_for_ping(url: str, process: "subprocess.Popen[bytes]") -> None:
    deadline = time.monotonic() + REDIS_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RedisUnavailable(f"redis-server for {url} exited with {process.returncode}")
        if _answers(url):
            return
        time.sleep(0.05)
    raise RedisUnavailable(f"redis-server for {url} did not answer in {REDIS_START_TIMEOUT_S}s")


def cpu_seconds(pid: int) -> float:
    """Return the user and system CPU seconds process `pid` has used (0.0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    # After the command's closing parenthesis: state is field 0, utime 11 and stime 12.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            kids.extend(int(kid) for kid in task.read_text().split())
        except OSError:
            continue
    return kids


def _signal_group(process: "subprocess.Popen[bytes]", signum: int) -> None:
    # Each process was started in a session of its own, so its group id is its pid.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def _end(process: "subprocess.Popen[bytes]", *, grace_s: float) -> None:
    _signal_group(process, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        process.wait()
