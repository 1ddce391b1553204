"""A database error's text, which reaches logs, task results and Sentry, quotes no parameter.

Statements carry messages' content and artifacts' data as parameters, and SQLAlchemy appends them
to an error's text unless the engine hides them: `make_engine` does, for SQLite and PostgreSQL.
"""

import asyncio
import secrets
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from actonce.worker.process.runtime import make_engine

CONTENT = f"content-{secrets.token_hex(8)}"


async def _failed_insert(url: str) -> str:
    engine = make_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.execute(text("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)"))
            insert = text("INSERT INTO notes (id, body) VALUES (:id, :body)")
            await connection.execute(insert, {"id": 1, "body": "first"})
            await connection.execute(insert, {"id": 1, "body": CONTENT})
    except IntegrityError as refused:
        return str(refused)
    finally:
        await engine.dispose()
    raise AssertionError("the duplicate key was accepted")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_failed_statements_error_does_not_quote_its_parameters(
    backend: str,
    tmp_path: Path,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> None:
    if backend == "sqlite":
        said = asyncio.run(_failed_insert(f"sqlite+aiosqlite:///{tmp_path / 'notes.db'}"))
    else:
        with postgres_database() as url:
            said = asyncio.run(_failed_insert(url))

    assert "INSERT INTO notes" in said, said  # the error names the statement
    assert CONTENT not in said, said
