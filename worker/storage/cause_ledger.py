"""relayr's SQL ledger with each cause record one statement, built once, alone on PostgreSQL.

relayr records the run behind each write an attempt makes before it makes it (`record_cause`):
three records for an attempt that posts a notice and makes a keyed edit. relayr adds each as an
ORM row to a session of its own and commits it, keeping the first row under a key by catching the
unique violation. Here the record is one `INSERT … ON CONFLICT DO NOTHING` on relayr's table,
built once: the same row, the first kept, standing alone (`worker.storage.autocommit`): in
autocommit on PostgreSQL, one round trip where `BEGIN` and `COMMIT` made three. Every other call of
the ledger is relayr's. A worker's attempt so spends less CPU on each write it records, and the
database sees one statement for it, not a transaction.
"""

from typing import override

import relayr.sql
from lattice_core.sql.sessions import awaited_to_the_end
from relayr.ledger import Cause, CauseKind, WorkspaceKey, utc_now
from relayr.sql.tables import CauseRow
from sqlalchemy.ext.asyncio import AsyncEngine

from actonce.tasks.sql import dialect_insert
from actonce.worker.storage.autocommit import StatementsAlone


class SqlLedger(relayr.sql.SqlLedger):
    """relayr's `SqlLedger` on `engine`, with its defaults (its clock, no row-level security),
    recording causes in one statement each.

    Args:
        engine: The engine of relayr's ledger tables, on PostgreSQL or SQLite.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        self._alone = StatementsAlone(engine)
        self._record = dialect_insert(engine.dialect.name)(CauseRow).on_conflict_do_nothing()

    @override
    @awaited_to_the_end
    async def record_cause(
        self, workspace: WorkspaceKey, kind: CauseKind, key: str, cause: Cause
    ) -> None:
        """Record the run behind a write, by what the follower will find it by; the first kept.

        Awaited to its end, as relayr's: a caller cancelled meanwhile (an attempt cut at its soft
        limit) is cancelled once the statement has answered.
        """
        row = {
            **workspace._asdict(),
            "kind": kind,
            "key": key,
            "recorded_at": utc_now(),  # relayr's clock, in UTC: SQLite compares text
            **cause.model_dump(),
        }
        async with self._alone.connect() as connection:
            await connection.execute(self._record, row)
