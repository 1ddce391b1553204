"""reflexr's SQL storage with each lease taken or renewed in one statement.

reflexr's `acquire_lease` runs an `UPDATE` and, when that matched no row, an `INSERT`: two round
trips for every lease that is free, which is every evaluation lease, since an evaluation releases
(deletes) its lease when it ends. Here it is one `INSERT … ON CONFLICT DO UPDATE … WHERE` (free,
expired or already the holder's): the same answers, one statement, and a race between holders is
settled by the database instead of by an `IntegrityError`. The dispatcher's evaluations and a
worker's attempts both lease through it.
"""

from datetime import timedelta
from typing import Any

import reflexr.sql
from lattice_core.sql.sessions import awaited_to_the_end
from reflexr.sql.tables import LeaseRow
from reflexr.workspace import WorkspaceRef
from reflexr.workspace.storage import utc_now
from sqlalchemy import or_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

_LEASES = LeaseRow.__table__

_DIALECTS = frozenset({"postgresql", "sqlite"})
"""What reflexr's SQL storage runs on; both have `INSERT … ON CONFLICT`."""


class UpsertLeaseStorage(reflexr.sql.SqlStorage):
    """reflexr's SQL storage whose `acquire_lease` is one upsert; the rest is reflexr's.

    Row-level security is not supported: the lease statement runs on `engine` as is.

    Args:
        engine: The reflexr store's engine, on PostgreSQL or SQLite.
        **options: As `reflexr.sql.SqlStorage` takes them; its `clock` dates the leases.

    Raises:
        ValueError: With `row_level_security`, or on another database.
    """

    def __init__(self, engine: AsyncEngine, **options: Any) -> None:
        if options.get("row_level_security"):
            raise ValueError("actonce's reflexr storage does not support row-level security")
        if engine.dialect.name not in _DIALECTS:
            raise ValueError(
                f"actonce's reflexr storage runs on PostgreSQL or SQLite, not {engine.dialect.name}"
            )
        super().__init__(engine, **options)
        self._engine = engine
        self._on_postgres = engine.dialect.name == "postgresql"
        self._now = options.get("clock", utc_now)

    @awaited_to_the_end
    async def acquire_lease(
        self, workspace: WorkspaceRef, key: str, holder: str, ttl: timedelta
    ) -> bool:
        """Take or renew an exclusive lease in one statement; False if another holder has it."""
        async with self._engine.begin() as connection:
            taken = await connection.execute(self.lease_statement(workspace, key, holder, ttl))
        return bool(taken.rowcount)

    def lease_statement(
        self, workspace: WorkspaceRef, key: str, holder: str, ttl: timedelta
    ) -> postgresql.Insert | sqlite.Insert:
        """The statement that takes or renews a lease; it changes one row, or none if refused.

        Run it in a transaction of the caller's to take a lease with other work.
        """
        now = self._now()
        insert = postgresql.insert if self._on_postgres else sqlite.insert
        values = {
            "tenant_id": workspace.tenant_id,
            "workspace_id": workspace.workspace_id,
            "key": key,
            "holder": holder,
            "expires_at": now + ttl,
        }
        return (
            insert(LeaseRow)
            .values(values)
            .on_conflict_do_update(
                index_elements=[_LEASES.c.tenant_id, _LEASES.c.workspace_id, _LEASES.c.key],
                set_={"holder": holder, "expires_at": now + ttl},
                where=or_(_LEASES.c.holder == holder, _LEASES.c.expires_at <= now),
            )
        )
