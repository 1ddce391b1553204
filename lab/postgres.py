"""Fresh PostgreSQL databases on the machine's server, one per test run or bench, dropped after."""

import asyncio
import contextlib
import secrets
from collections.abc import Iterator
from typing import Final

import asyncpg

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


# ─── how ──────────────────────────────────────────────────────────────────────


async def _postgres_admin(statement: str) -> None:
    connection = await asyncpg.connect(POSTGRES_ADMIN_DSN, timeout=POSTGRES_CONNECT_TIMEOUT_S)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()
