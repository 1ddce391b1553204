"""Fresh stores for one figure: a PostgreSQL database made and dropped, or SQLite files."""

import asyncio
import contextlib
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import asyncpg

POSTGRES_ADMIN_DSN: Final = "postgresql://postgres@127.0.0.1:5432/postgres"
"""The machine's PostgreSQL server (trust auth), reached through its `postgres` database."""


class PostgresUnreachable(RuntimeError):
    """Raised when no database can be created on the machine's PostgreSQL."""


async def _admin(statement: str) -> None:
    connection = await asyncpg.connect(POSTGRES_ADMIN_DSN, timeout=5.0)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


@contextlib.contextmanager
def fresh_stores(backend: str, prefix: str) -> Iterator[dict[str, str]]:
    """Yield the `ACTONCE_*` store variables of empty stores, removed afterwards.

    `postgres`: a database `<prefix>_<hex>` on 127.0.0.1:5432, dropped `WITH (FORCE)`.
    `sqlite`: one file per store in a temporary directory.

    Raises:
        PostgresUnreachable: If the database cannot be created.
    """
    if backend == "postgres":
        name = f"{prefix}_{secrets.token_hex(5)}"
        try:
            asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
        except (OSError, TimeoutError, asyncpg.PostgresError) as unreachable:
            raise PostgresUnreachable(
                f"cannot create a database on PostgreSQL at {POSTGRES_ADMIN_DSN}: {unreachable!r}"
            ) from unreachable
        try:
            yield {"ACTONCE_DATABASE_URL": f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"}
        finally:
            asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    elif backend == "sqlite":
        home = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
        try:
            yield {"ACTONCE_VAR_DIR": str(home)}
        finally:
            shutil.rmtree(home, ignore_errors=True)
    else:
        raise ValueError(f"backend must be postgres or sqlite, not {backend!r}")
