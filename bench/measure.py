"""What a contender costs: CPU of its processes and of PostgreSQL's backends, and its SQL.

`Sampler` reads, every `every_s` on a thread of its own, the CPU time (user + system, psutil) of
every process this bench started (its children and their descendants, labelled by what they
run) and of every PostgreSQL backend connected to the contender's database, on the server the
bench was given (`admin_dsn`), except the bench's own connections, and what each of those
backends that is running a statement waits for (`pg_stat_activity`), tallied in `waits()`. The
bench's own are told apart by client port over TCP, and by backend pid (`own_backends`: the
engines the bench reads and publishes through, and the sampler's own connections) over a Unix
socket, where every client's port is -1. `mark()` takes a reading now;
the cost of a window is one mark minus another, pid by pid, so a process that exited inside the
window still counts up to its last reading. A backend that lives less than `every_s` is missed:
the pools keep their connections, so few do.

Beside the backends (label `postgres`), it reads the server's own processes (label
`postgres:server`): the postmaster and those of its children bound to no database, such as the
checkpointer, the background writer, the WAL writer and the autovacuum launcher; found again
once a second. They serve the whole server: on a server other databases use too, their CPU is
partly others'. The backends of other databases, and autovacuum workers of other databases,
are never counted.

`machine()` reads how long every core of the machine has been busy so far, whatever ran there
(`MachineReading`): the share of all cores a window kept busy tells a contender bound by its own
locks from one bound by the machine.

`transactions(database, admin_dsn)` reads PostgreSQL's own count of committed and rolled-back
transactions of a database (`pg_stat_database`), every connection included. `SqlFiles` sums the
statements and transactions the contender's processes counted themselves
(`bench/sqlcount/sitecustomize.py`).
"""

import asyncio
import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import asyncpg
import psutil
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

PG_PORT: Final = 5432
"""PostgreSQL's port when the server's URL names none."""

OWN_PORTS_EVERY_S: Final = 1.0
"""How often a reading finds the bench's own connections to PostgreSQL, and the server's own
processes, again."""

SERVER: Final = "postgres:server"
"""The label of the PostgreSQL server's own processes: the postmaster and its children bound to
no database."""

type Reading = dict[tuple[str, int], float]
"""CPU seconds so far, by (label, pid)."""


def label_of(process: psutil.Process) -> str:
    """What a process of a contender is, from its command line."""
    try:
        line = " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    return label_of_command(line)


def label_of_command(line: str) -> str:
    """What a process of a contender is, from its command line as one string."""
    if "redis-server" in line:
        return "redis"
    if "bench.reactor_serve" in line or "bench.reactor_loop" in line:
        return "reactor"
    if " dispatch" in line:
        return "dispatcher"
    if " worker" in line:
        return "celery"
    return "other"


def _cpu(process: psutil.Process) -> float | None:
    try:
        times = process.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return float(times.user + times.system)


class Sampler:
    """CPU readings of the bench's child process trees and of one database's backends.

    Args:
        database: The contender's PostgreSQL database name, or None to read no backends.
        admin_dsn: A libpq DSN of the server's `postgres` database (`PostgresHandle.admin_dsn`),
            where `database` is; needed with a database.
        every_s: How often to read.

    Raises:
        ValueError: If a database is given without `admin_dsn`.
    """

    def __init__(
        self, database: str | None, admin_dsn: str | None = None, every_s: float = 0.25
    ) -> None:
        if database is not None and admin_dsn is None:
            raise ValueError(f"Sampler({database!r}) needs the admin_dsn of its server")
        self._database = database
        self._admin_dsn = admin_dsn or ""
        self._port = (make_url(admin_dsn).port or PG_PORT) if admin_dsn else PG_PORT
        self._every_s = every_s
        self._latest: Reading = {}
        self._waits: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._me = psutil.Process()
        self._labels: dict[int, str] = {}
        self._ours: set[int] = set()
        self._ours_until = 0.0
        self._server: set[int] = set()

    def __enter__(self) -> "Sampler":
        self._thread = threading.Thread(target=self._loop, name="bench-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def mark(self) -> Reading:
        """Read now, and return every pid's CPU seconds so far (exited ones at their last)."""
        asyncio.run(self._read_once(None))
        with self._lock:
            return dict(self._latest)

    def waits(self) -> Counter[str]:
        """How often, so far, a reading found one of the database's backends running a statement,
        by what it waited for: `running` (on a CPU, or for one), or PostgreSQL's
        `wait_event_type:wait_event` (`Lock:tuple` and `Lock:transactionid` wait for a row
        another transaction holds, `IO:WALSync` for a commit's flush)."""
        with self._lock:
            return Counter(self._waits)

    def _loop(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        # One connection for the thread's readings: connecting anew each time would start a
        # PostgreSQL backend four times a second, on the machine being measured.
        connection = await _admin(self._admin_dsn) if self._database is not None else None
        try:
            while not self._stop.is_set():
                await self._read_once(connection)
                await asyncio.sleep(self._every_s)
        finally:
            if connection is not None:
                await _close(connection)

    async def _read_once(self, connection: Any) -> None:
        found: Reading = {}
        for process, role in self._processes():
            used = _cpu(process)
            if used is not None:
                found[(role, process.pid)] = used
        for label, pid in await self._backends(connection):
            try:
                used = _cpu(psutil.Process(pid))
            except psutil.NoSuchProcess:  # the backend ended since PostgreSQL listed it
                continue
            if used is not None:
                found[(label, pid)] = used
        with self._lock:
            self._latest.update(found)

    def _processes(self) -> list[tuple[psutil.Process, str]]:
        """Every process this bench started, labelled by its ancestor among the bench's children
        (`redis`, `celery`, `celery:children`…), from one scan of the process table.

        psutil builds its parent map from the whole process table on every `children()` call:
        one call per child made a reading cost 26 ms of the bench's CPU, four times a second,
        on the cores the contender is measured on.
        """
        try:
            everyone = self._me.children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        by_pid = {process.pid: process for process in everyone}
        parents: dict[int, int] = {}
        for process in everyone:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                parents[process.pid] = process.ppid()
        found = []
        for process in everyone:
            if process.pid not in parents:
                continue  # gone since the scan
            top = process.pid
            while (up := parents.get(top)) in parents:
                top = up  # up to the bench's own child
            label = self._labels.get(top)
            if label is None:
                label = label_of(by_pid[top])
                # A child read between its fork and its exec still shows the bench's command
                # line (`other`): it is named again at the next reading, not for good.
                if label not in ("other", "gone"):
                    self._labels[top] = label
            found.append((process, label if top == process.pid else f"{label}:children"))
        return found

    async def _backends(self, connection: Any) -> list[tuple[str, int]]:
        """The pids of the backends serving the database, but the bench's own (`postgres`), and
        of the server's own processes (`SERVER`); what the backends running a statement wait for
        is tallied into `waits()` from the same read."""
        if self._database is None:
            return []
        own_connection = connection is None
        if own_connection:
            connection = await _admin(self._admin_dsn)
        try:
            # Which connections are the bench's own, and which processes are the server's,
            # change seldom (its pools keep their connections), and finding them cost 9 ms of
            # CPU: found again once a second. The postmaster's children are listed before
            # pg_stat_activity is read, so that every backend among them is in the read.
            now = time.monotonic()
            refresh = now >= self._ours_until
            children = _server_processes(connection.get_server_pid()) if refresh else set()
            rows = await connection.fetch(
                "SELECT pid, client_port, state, wait_event_type, wait_event, datname,"
                " backend_type FROM pg_stat_activity"
            )
            if refresh:
                self._ours = _own_client_ports(self._me, self._port)
                backends = {
                    row["pid"]
                    for row in rows
                    if row["datname"] is not None or row["backend_type"] == "client backend"
                }
                self._server = children - backends
                self._ours_until = now + OWN_PORTS_EVERY_S
        finally:
            if own_connection:
                await _close(connection)
        ours = self._ours
        rows = [row for row in rows if row["datname"] == self._database]
        own_pids = _OWN_BACKENDS
        theirs = [
            row for row in rows if row["client_port"] not in ours and row["pid"] not in own_pids
        ]
        waits = Counter(
            f"{row['wait_event_type']}:{row['wait_event']}" if row["wait_event_type"] else "running"
            for row in theirs
            if row["state"] == "active"
        )
        with self._lock:
            self._waits.update(waits)
        return [("postgres", row["pid"]) for row in theirs] + [
            (SERVER, pid) for pid in self._server
        ]


def own_backends(engine: AsyncEngine) -> None:
    """Count every connection `engine` makes from now on as the bench's own, until it closes:
    its backend is never the contender's."""

    def on_connect(connection: Any, record: Any) -> None:
        pid = connection.driver_connection.get_server_pid()
        record.info[_PID] = pid
        _OWN_BACKENDS.add(pid)

    def on_close(_connection: Any, record: Any) -> None:
        # The server may give a closed backend's pid to a contender's next one.
        _OWN_BACKENDS.discard(record.info.pop(_PID, None))

    if engine.dialect.name == "postgresql":
        event.listen(engine.sync_engine, "connect", on_connect)
        event.listen(engine.sync_engine, "close", on_close)


_OWN_BACKENDS: Final[set[int | None]] = set()
"""The pids of the backends serving this process's open connections (`own_backends`, `_admin`)."""

_PID: Final = "bench_backend_pid"
"""Where a pooled connection's record keeps its backend's pid."""


async def _admin(dsn: str) -> Any:
    connection = await asyncpg.connect(dsn, timeout=5)
    _OWN_BACKENDS.add(connection.get_server_pid())
    return connection


async def _close(connection: Any) -> None:
    _OWN_BACKENDS.discard(connection.get_server_pid())
    await connection.close()


def _server_processes(backend_pid: int) -> set[int]:
    """The postmaster that started the backend `backend_pid`, and every child of it; none when
    the server is not on this machine."""
    try:
        postmaster = psutil.Process(psutil.Process(backend_pid).ppid())
        return {postmaster.pid, *(child.pid for child in postmaster.children())}
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return set()


def _own_client_ports(me: psutil.Process, port: int) -> set[int]:
    return {
        c.laddr.port
        for c in me.net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.laddr
    }


@dataclass(frozen=True)
class MachineReading:
    """How long the machine's cores have been busy so far, and when that was read."""

    busy_s: float
    """CPU seconds all cores spent on anything but idling and waiting for I/O, since boot."""

    at: float
    """`time.monotonic()` when read."""

    def busy_share(self, before: "MachineReading") -> float:
        """The share of all the machine's cores kept busy from `before` to this reading."""
        wall = self.at - before.at
        cores = psutil.cpu_count() or 1
        if wall <= 0:
            return 0.0
        # The kernel counts busy time in ticks (10 ms): a window with every core busy can read a
        # hair over all of them (1.00014 was seen), which no machine is.
        return min(1.0, max(0.0, self.busy_s - before.busy_s) / (wall * cores))


def machine() -> MachineReading:
    """Read the machine's busy CPU seconds now, every process of every user included."""
    times = psutil.cpu_times()
    total = sum(times)
    # On Linux a guest's time is counted in user time too: psutil lists it apart as well.
    counted_twice = getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return MachineReading(busy_s=total - counted_twice - idle, at=time.monotonic())


def window(before: Reading, after: Reading, keep: Callable[[str], bool]) -> dict[str, float]:
    """CPU seconds spent between two marks, by label, for labels `keep` accepts."""
    spent: dict[str, float] = {}
    for key, used in after.items():
        label, _ = key
        if keep(label):
            spent[label] = spent.get(label, 0.0) + max(0.0, used - before.get(key, 0.0))
    return spent


async def _transactions(database: str, admin_dsn: str) -> int:
    connection = await _admin(admin_dsn)
    try:
        # The statistics collector is read within a snapshot: clear it to see the latest.
        await connection.execute("SELECT pg_stat_clear_snapshot()")
        value = await connection.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1",
            database,
        )
    finally:
        await _close(connection)
    return int(value or 0)


def transactions(database: str, admin_dsn: str) -> int:
    """PostgreSQL's count of transactions committed or rolled back in `database` so far, on the
    server whose `postgres` database `admin_dsn` names."""
    return asyncio.run(_transactions(database, admin_dsn))


@dataclass(frozen=True)
class SqlTotals:
    """Statements and transactions counted by the contender's processes."""

    statements: int
    transactions: int
    by_pid: dict[int, int] = field(default_factory=dict)
    """Each process's statements, by its pid."""


class SqlFiles:
    """The counts each process of a contender writes to `<directory>/<pid>.json`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def totals(self) -> SqlTotals:
        """Sum every process's latest counts."""
        statements = transactions = 0
        by_pid: dict[int, int] = {}
        for path in self.directory.glob("*.json"):
            try:
                counts = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            by_pid[int(path.stem)] = int(counts.get("statements", 0))
            statements += int(counts.get("statements", 0))
            transactions += int(counts.get("transactions", 0))
        return SqlTotals(statements, transactions, by_pid)
