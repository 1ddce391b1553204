"""Counting rows straight from the stores' tables: the runs settled, and actonce's own tables.

Reading runs through reflexr lists them all, which costs more with every run a long harness
made; a count stays cheap. What counts as settled is `lab.settle.TERMINAL`.
"""

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from lab.settle import TERMINAL

OWN_TABLES = text(
    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
    "AND tablename LIKE 'actonce\\_%' ORDER BY tablename"
)
# Written for PostgreSQL and SQLite (3.38 and later) alike; the statuses are constants.
SETTLED = text(
    "SELECT count(*), count(*) FILTER (WHERE status = 'succeeded'), "
    "coalesce(sum(CAST(body->>'attempts' AS INTEGER)), 0) FROM reflexr_runs "
    f"WHERE status IN ({', '.join(repr(status) for status in sorted(TERMINAL))})"
)


@dataclass(frozen=True)
class Settled:
    """The runs settled so far, in every workspace of one reflexr store."""

    runs: int
    """How many have settled (`lab.settle.TERMINAL`)."""

    succeeded: int
    """How many of them succeeded."""

    attempts: int
    """How many attempts they took, all told."""


async def settled_runs(engine: AsyncEngine) -> Settled:
    """Return the runs settled so far in reflexr's store on `engine`."""
    async with engine.connect() as connection:
        row = (await connection.execute(SETTLED)).one()
    return Settled(int(row[0]), int(row[1]), int(row[2]))


async def actonce_rows(engine: AsyncEngine) -> dict[str, int]:
    """Return the row count of each of actonce's own tables (`actonce_*`) on `engine`, by name
    (PostgreSQL only)."""
    async with engine.connect() as connection:
        names = [str(name) for name in (await connection.execute(OWN_TABLES)).scalars()]
        return {
            name: int(
                (await connection.execute(text(f'SELECT count(*) FROM "{name}"'))).scalar_one()
            )
            for name in names
        }
