"""The pool under test: a running pool on one backend and a test's own workspace on it.

`Pool` holds the subprocesses (`lab.pool.LocalPool`) and a `Runtime` in the test process over
the same stores; `Scene` is one test's workspace, with what a test does there: publish work,
wait for its runs, count artifactr's log, send attempt messages, find dead letters.
"""

import ast
import asyncio
import contextlib
import hashlib
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import asyncpg
import redis
import sqlalchemy as sa
from celery.result import AsyncResult
from reflexr.core import Run
from sqlalchemy.engine import make_url

from actonce.worker.dead_letters.store import DeadLetter
from actonce.worker.definition import load_definition
from actonce.worker.dispatching.dispatcher import send_attempt
from actonce.worker.process.runtime import Runtime, make_engine
from actonce.worker.settings import Settings
from actonce.worker.storage.migrate import migrate
from demo.definition import WorkRequested
from demo.feed import FEED, PEOPLE, prepare, request_work
from lab.census import Census, artifactr_census
from lab.pool import LocalPool
from lab.postgres import PostgresHandle
from lab.redis import RedisHandle
from lab.settle import wait_settled

TENANT: Final = "t_pool"
"""The tenant every scene's workspace belongs to."""

REDIS_DB: Final = {"sqlite": 1, "postgres": 2}
"""The private Redis's database each backend's pool uses."""

POOL_ENV: Final = {
    "ACTONCE_LEASE_TTL_S": "3",
    "ACTONCE_POLL_INTERVAL_S": "0.1",
    "ACTONCE_DEDUPE_TTL_S": "5",
    "ACTONCE_SOFT_TIME_LIMIT_S": "50",
    "ACTONCE_TIME_LIMIT_S": "60",
    "ACTONCE_MAX_RETRY_DELAY_S": "300",
    "ACTONCE_VISIBILITY_TIMEOUT_S": "400",
    "ACTONCE_MAX_MESSAGE_BYTES": "4096",
}
"""Settings that make the pool's tests quick: a 3 s lease, so a killed attempt is taken over
soon; the visibility timeout still exceeds the hard limit plus the longest retry delay."""


@dataclass
class Scene:
    """One test's own workspace on the shared pool, and what the test does with it."""

    pool: "Pool"
    workspace_id: str

    def request(self, key: str, **knobs: Any) -> None:
        """Publish a `WorkRequested` named `key`, with the demo's misbehaviour knobs."""
        event = WorkRequested(key=key, **knobs)
        self.pool.run(request_work(self.pool.runtime.reflexr, TENANT, self.workspace_id, event))

    def settled(self, runs: int = 1, timeout_s: float = 45.0) -> list[Run]:
        """Wait until this workspace has `runs` runs, all finished; return them."""
        return self.pool.run(self._settled(runs, timeout_s))

    def runs(self) -> list[Run]:
        """Return this workspace's runs as they are now."""
        return self.pool.run(self._runs())

    def census(self) -> Census:
        """Count what this workspace's artifactr log holds, by id."""
        return self.pool.run(self._census())

    def send(self, run_id: str) -> AsyncResult:
        """Send one attempt message for `run_id`, as the dispatcher does."""
        return send_attempt(self.pool.local.celery, TENANT, self.workspace_id, run_id)

    def task_of(self, run_id: str) -> str:
        """Return the id of the task that succeeded for this workspace's `run_id`."""
        return self.pool.task_of(self.workspace_id, run_id)

    def kill_attempt(self, run_id: str) -> int:
        """SIGKILL the prefork child attempting this workspace's `run_id`; return its pid."""
        return self.pool.local.kill_worker_child(run_id=run_id, workspace_id=self.workspace_id)

    def letter_of(self, run_id: str, timeout_s: float = 10.0) -> DeadLetter:
        """Wait for the dead letter of `run_id` and return it."""
        return self.pool.letter(
            lambda letter: (letter.workspace_id, letter.run_id) == (self.workspace_id, run_id),
            timeout_s,
        )

    async def _settled(self, runs: int, timeout_s: float) -> list[Run]:
        workspace = await self.pool.runtime.reflexr.open(TENANT, self.workspace_id, actor=FEED)
        return await wait_settled(workspace.runs, runs=runs, timeout_s=timeout_s)

    async def _runs(self) -> list[Run]:
        workspace = await self.pool.runtime.reflexr.open(TENANT, self.workspace_id, actor=FEED)
        return list(await workspace.runs())

    async def _census(self) -> Census:
        workspace = await self.pool.runtime.artifactr.open(TENANT, self.workspace_id, actor=PEOPLE)
        return await artifactr_census(workspace)


@dataclass
class Pool:
    """A running pool on one backend, and a runtime in the test process over the same stores."""

    backend: str
    env: dict[str, str]
    local: LocalPool
    runtime: Runtime

    def run[T](self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the test process's runtime loop."""
        return self.runtime.run(coroutine)

    def scene(self, name: str) -> Scene:
        """Return a fresh workspace named after `name`, with the demo's thread and artifacts."""
        digest = hashlib.sha256(f"{name}-{secrets.token_hex(4)}".encode()).hexdigest()[:12]
        workspace_id = f"ws_{digest}"
        self.run(prepare(self.runtime.artifactr, TENANT, workspace_id))
        return Scene(self, workspace_id)

    def letters(self) -> list[DeadLetter]:
        """Return every dead letter, replayed ones too."""
        return self.run(self.runtime.dead_letters.list(limit=1000, include_replayed=True))

    def letter(self, match: Callable[[DeadLetter], bool], timeout_s: float = 10.0) -> DeadLetter:
        """Wait for a dead letter `match` accepts, and return it."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [letter for letter in self.letters() if match(letter)]
            if found:
                assert len(found) == 1, f"one dead letter expected, found {found}"
                return found[0]
            assert time.monotonic() < deadline, (
                f"no such dead letter after {timeout_s}s; the worker said:\n{self.worker_log()}"
            )
            time.sleep(0.1)

    def result(self, task_id: str) -> AsyncResult:
        """Return the result of a task the test sent itself, read from the result backend.

        The dispatcher sends attempts with their results ignored: read those with `final_state`.
        """
        return AsyncResult(task_id, app=self.local.celery)

    def summary(self, task_id: str, timeout_s: float = 30.0) -> dict[str, object]:
        """Wait for the summary the worker logged when the task succeeded, and return it."""
        pattern = re.compile(rf"\[{re.escape(task_id)}\] succeeded in [^:]+: (\{{.*\}})")
        deadline = time.monotonic() + timeout_s
        while (found := pattern.search(self.worker_log())) is None:
            assert time.monotonic() < deadline, f"{task_id} did not succeed:\n{self.worker_log()}"
            time.sleep(0.1)
        summary = ast.literal_eval(found.group(1))
        assert isinstance(summary, dict)
        return summary

    def final_state(self, task_id: str) -> str | None:
        """Return the last state the worker reported for a task (SUCCESS, FAILURE, RETRY)."""
        states = self.task_states(task_id)
        return states[-1] if states else None

    def task_states(self, task_id: str) -> list[str]:
        """Return the states the worker logged for a task, in order (RETRY, SUCCESS, FAILURE)."""
        states = []
        pattern = re.compile(rf"\[{re.escape(task_id)}\] (retry|succeeded|raised|failed)")
        for match in pattern.finditer(self.worker_log()):
            states.append(_STATES[match.group(1)])
        return states

    def task_of(self, workspace_id: str, run_id: str, timeout_s: float = 10.0) -> str:
        """Wait for the task the worker logged succeeding for a workspace's run; return its id.

        The run's success is committed before Celery logs the task's, so a test that saw the
        run settle polls the log for the line.
        """
        pattern = re.compile(r"\[([0-9a-f-]{36})\] succeeded in [^:]+: (\{.*\})")
        wanted = (f"'run_id': '{run_id}'", f"'workspace_id': '{workspace_id}'")
        deadline = time.monotonic() + timeout_s
        while True:
            for match in pattern.finditer(self.worker_log()):
                if all(part in match.group(2) for part in wanted):
                    return match.group(1)
            assert time.monotonic() < deadline, (
                f"no task succeeded for {run_id}:\n{self.worker_log()[-4000:]}"
            )
            time.sleep(0.1)

    def worker_log(self) -> str:
        """Return what the pool's worker logged so far."""
        return self.local.log("worker0")

    def assert_alive(self) -> None:
        """Fail if a process of the pool has exited."""
        for name, process in self.local._processes.items():
            assert process.poll() is None, f"{name} exited:\n{self.local.log(name)[-4000:]}"


_STATES: Final = {
    "retry": "RETRY",
    "succeeded": "SUCCESS",
    "raised": "FAILURE",
    "failed": "FAILURE",
}
"""Celery's log words for a task's states."""


def statements_on(engine: Any) -> list[str]:
    """Return a list that every statement run on `engine` (an async engine) is appended to from
    now on, its whitespace collapsed: what a test counts SQL by."""
    seen: list[str] = []

    def on_statement(connection: object, cursor: object, statement: str, *_: object) -> None:
        seen.append(" ".join(statement.split()))

    sa.event.listen(engine.sync_engine, "before_cursor_execute", on_statement)
    return seen


@contextlib.contextmanager
def database(
    backend: str, postgres_database: Callable[[], AbstractContextManager[str]]
) -> Iterator[str | None]:
    """Yield a fresh PostgreSQL database's URL for `backend` postgres, dropped after; else None."""
    if backend != "postgres":
        yield None
        return
    with postgres_database() as url:
        yield url


@contextlib.contextmanager
def running_pool(
    backend: str,
    env: dict[str, str],
    base: Path,
    postgres_database: Callable[[], AbstractContextManager[str]],
    **local: Any,
) -> Iterator[Pool]:
    """Yield a pool on `backend`: its stores migrated (a fresh PostgreSQL database, or SQLite
    files under `base`), its Redis database emptied, its processes (`LocalPool(**local)`) ready,
    and a runtime in the test process; everything stopped and dropped after.

    `env` holds the pool's settings and at least `ACTONCE_BROKER_URL`, a Redis database of its
    own: modules share the session's Redis, and no message or mark an earlier module's pool left
    behind may reach this one.
    """
    env = {**env, "ACTONCE_VAR_DIR": str(base / "var")}
    with database(backend, postgres_database) as database_url:
        if database_url is not None:
            env["ACTONCE_DATABASE_URL"] = database_url
        settings = Settings.from_env(env)
        asyncio.run(migrate(settings))
        flush(env["ACTONCE_BROKER_URL"])
        runtime = Runtime(settings, load_definition(settings.app), one_run=False).open()
        try:
            with LocalPool(env, log_dir=base / "logs", **local) as processes:
                processes.wait_ready(timeout_s=60)
                yield Pool(backend, env, processes, runtime)
        finally:
            runtime.close()


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Wait until `condition()` holds, failing with `what` after `timeout_s`."""
    wait_for(lambda: True if condition() else None, what, timeout_s)


def wait_for[T](found: Callable[[], T | None], what: str, timeout_s: float = 20.0) -> T:
    """Poll `found` until it returns something other than None, and return that; fail with
    `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (value := found()) is None:
        assert time.monotonic() < deadline, f"gave up waiting for {what} after {timeout_s}s"
        time.sleep(0.1)
    return value


def flush(url: str) -> None:
    """Empty the Redis database at `url`."""
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


async def execute(database_url: str, *statements: str) -> None:
    """Run `statements` on the database at `database_url`, in one transaction."""
    engine = make_engine(database_url)
    try:
        async with engine.begin() as connection:
            for statement in statements:
                await connection.execute(sa.text(statement))
    finally:
        await engine.dispose()


async def drop_the_waiting_connection(
    database_url: str, table: str, meanwhile: Callable[[], Awaitable[None]]
) -> None:
    """Lock `table`, await `meanwhile` (which makes another process's statement on it wait), and
    terminate the backend of that statement, as a database that drops a connection would."""
    engine = make_engine(database_url)
    try:
        async with engine.connect() as holder, engine.connect() as watcher:
            await holder.execute(sa.text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
            await meanwhile()
            waiting = await _backend_waiting_on(watcher, table)
            await watcher.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": waiting})
            await watcher.commit()
            await holder.rollback()
    finally:
        await engine.dispose()


async def _backend_waiting_on(connection: sa.ext.asyncio.AsyncConnection, table: str) -> int:
    """The pid of the backend whose statement on `table` waits on a lock; polls for 30 s."""
    query = sa.text(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND query ILIKE :table"
    )
    deadline = time.monotonic() + 30
    while True:
        pid = (await connection.execute(query, {"table": f"%{table}%"})).scalar()
        await connection.commit()
        if pid is not None:
            return int(pid)
        assert time.monotonic() < deadline, f"no statement on {table} waited on its lock"
        await asyncio.sleep(0.1)


@contextlib.contextmanager
def database_away(server: PostgresHandle, database_url: str) -> Iterator[None]:
    """Make the database at `database_url` unreachable while the body runs, as a database that
    went down would be: every connection to it terminated, and new ones refused
    (`ALLOW_CONNECTIONS false`, which holds for superusers too); allowed again after.

    Connections a process kept are gone when it returns: SQLAlchemy replaces them after the
    first statement fails, so a test disposes its own engines before it reads.
    """
    name = make_url(database_url).database
    assert name, f"no database named in {database_url}"
    asyncio.run(_on_server(server, f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false'))
    try:
        asyncio.run(
            _on_server(
                server,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                f" WHERE datname = '{name}' AND pid <> pg_backend_pid()",
            )
        )
        yield
    finally:
        asyncio.run(_on_server(server, f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true'))


async def _on_server(server: PostgresHandle, statement: str) -> None:
    """Run `statement` on the server's `postgres` database, as its administrator."""
    connection = await asyncpg.connect(server.admin_dsn, timeout=10)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


def broker_url(redis_server: RedisHandle, db: int) -> str:
    """The URL of database `db` of the session's private Redis."""
    return redis_server.url.rsplit("/", 1)[0] + f"/{db}"
