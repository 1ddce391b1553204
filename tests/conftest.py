"""Fixtures shared by every test: real servers, one fresh database or key space per test."""

import asyncio
import os
import secrets
from collections.abc import Iterator
from typing import Final

import asyncpg
import pytest

POSTGRES_ADMIN_DSN: Final = "postgresql://postgres@127.0.0.1:5432/postgres"
"""The machine's PostgreSQL server (trust auth), reached through its `postgres` database."""

POSTGRES_CONNECT_TIMEOUT_S: Final = 5.0
"""How long a test waits for PostgreSQL before counting it unreachable."""


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """Yield the SQLAlchemy URL of a fresh, empty PostgreSQL database, dropped after the test.

    The database is named `actonce_test_<random hex>` and dropped `WITH (FORCE)`, so connections a
    test left open do not keep it. Without a reachable server the test skips on a laptop, and
    fails when the environment variable `CI` is set: CI never passes by skipping.
    """
    name = f"actonce_test_{secrets.token_hex(6)}"
    try:
        asyncio.run(_postgres(f'CREATE DATABASE "{name}"'))
    except (OSError, TimeoutError, asyncpg.PostgresError) as unreachable:
        why = f"cannot create a database on PostgreSQL at {POSTGRES_ADMIN_DSN}: {unreachable!r}"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI is set, so the PostgreSQL tests must run, not skip")
        pytest.skip(f"{why}; start it (or set CI to make this a failure)")
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
    finally:
        asyncio.run(_postgres(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def _postgres(statement: str) -> None:
    """Run one statement on the server's `postgres` database."""
    connection = await asyncpg.connect(POSTGRES_ADMIN_DSN, timeout=POSTGRES_CONNECT_TIMEOUT_S)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()
