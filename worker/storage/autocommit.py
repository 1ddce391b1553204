"""Connections for statements that need no transaction around them, by store dialect.

A single `INSERT … ON CONFLICT` or `DELETE` is atomic alone. On PostgreSQL it runs in autocommit:
one round trip, where `BEGIN`, the statement and `COMMIT` made three. On SQLite it runs in a
transaction, as `engine.begin()` makes it: lattice's engine there begins every transaction
itself.
"""

import contextlib
from collections.abc import AsyncIterator

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


class StatementsAlone:
    """Hands out connections for statements that stand alone, on `engine`.

    Args:
        engine: The store's engine, PostgreSQL or SQLite.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._autocommit = (
            engine.execution_options(isolation_level="AUTOCOMMIT")
            if engine.dialect.name == "postgresql"
            else None
        )

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        """A connection on which each statement commits as it runs (PostgreSQL), or one
        transaction committed when the block ends (elsewhere). Run one statement on it, or
        several that need no atomicity together."""
        if self._autocommit is None:
            async with self._engine.begin() as connection:
                yield connection
        else:
            async with self._autocommit.connect() as connection:
                yield connection
