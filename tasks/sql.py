"""What actonce's SQL shares: a UTC timestamp column, an insert that runs once, and the
dialect's insert that builds `ON CONFLICT` (also the worker's, on reflexr's and relayr's tables).

Dead letters and turn requests live beside reflexr's, artifactr's and relayr's tables, on SQLite
or PostgreSQL; both keep rows by a key that a retry may present again, and both need aware UTC
times back from SQLite, which keeps no offset.
"""

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection


class UtcDateTime(sa.TypeDecorator[datetime]):
    """A timestamp stored in UTC that reads back timezone-aware, in UTC, on every database.

    A naive time is refused when written (`ValueError`): its zone is unknown.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        utc = aware_utc(value, "timestamp")
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def aware_utc(at: datetime, name: str) -> datetime:
    """Return `at` in UTC.

    Raises:
        ValueError: Naming `name`, if `at` is naive.
    """
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, such as datetime.now(UTC), not {at}")
    return at.astimezone(UTC)


type DialectInsert = Callable[[Any], postgresql.Insert | sqlite.Insert]
"""PostgreSQL's or SQLite's `insert`: one whose statements take an `ON CONFLICT` clause."""


def dialect_insert(dialect: str) -> DialectInsert:
    """Return PostgreSQL's `insert` for `"postgresql"`, else SQLite's: the stores run on one or
    the other, and the two differ in the `ON CONFLICT` clauses they build."""
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


async def insert_once(connection: AsyncConnection, table: sa.Table, row: dict[str, Any]) -> bool:
    """Insert a row unless its key exists; return whether it did, leaving the transaction usable.

    PostgreSQL and SQLite skip a conflicting row in the statement itself; other databases catch
    the conflict in a savepoint.
    """
    name = connection.dialect.name
    if name in ("postgresql", "sqlite"):
        statement = dialect_insert(name)(table).values(row).on_conflict_do_nothing()
        return bool((await connection.execute(statement)).rowcount == 1)
    try:
        async with connection.begin_nested():
            await connection.execute(sa.insert(table).values(row))
    except IntegrityError:
        return False
    return True
