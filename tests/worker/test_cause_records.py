"""Cause records in one statement (`worker.storage.cause_ledger`), on SQLite and PostgreSQL.

A cause recorded through actonce's ledger is the row relayr's own ledger records and reads back,
the first under a key kept; on PostgreSQL it is one statement on a connection in autocommit.
"""

import asyncio
from datetime import UTC, datetime, timedelta

import relayr.sql
import sqlalchemy as sa
from pools import statements_on
from relayr.ledger import Cause, WorkspaceKey
from relayr.sql.tables import CauseRow

from actonce.worker.process.runtime import make_engine
from actonce.worker.settings import Settings
from actonce.worker.storage.cause_ledger import SqlLedger

OURS = WorkspaceKey("t", "w_ours")
THEIRS = WorkspaceKey("t", "w_theirs")
FIRST = Cause(correlation_id="cor_1", firing_id="fir_1", run_id="fir_1", depth=1)
LATER = Cause(correlation_id="cor_2", firing_id="fir_2", run_id="fir_2", depth=2)


def test_a_cause_is_relayrs_own_row_the_first_kept_recorded_in_one_statement(
    settings_of: Settings,
) -> None:
    async def scenario() -> None:
        engine = make_engine(settings_of.store_url("relayr"))
        postgres = engine.dialect.name == "postgresql"
        try:
            ours, theirs = SqlLedger(engine), relayr.sql.SqlLedger(engine)
            statements = statements_on(engine)
            begun: list[sa.Connection] = []
            sa.event.listen(engine.sync_engine, "begin", begun.append)
            # When actonce's ledger records the cause of a message
            await ours.record_cause(OURS, "message", "msg_1", FIRST)
            # Then that is one statement, on PostgreSQL in autocommit (no BEGIN and COMMIT
            # round trips; SQLite's connection begins its transaction itself)
            assert sum("relayr_causes" in statement for statement in statements) == 1
            isolation = begun[0].get_execution_options().get("isolation_level")
            assert isolation == ("AUTOCOMMIT" if postgres else None)
            # and relayr's own ledger reads it back
            assert await theirs.cause(OURS, "message", "msg_1") == FIRST
            # and a later cause under the same key leaves the first in place
            await ours.record_cause(OURS, "message", "msg_1", LATER)
            assert await theirs.cause(OURS, "message", "msg_1") == FIRST
            # and the row is the one relayr's ledger records for the same cause
            await theirs.record_cause(THEIRS, "message", "msg_1", FIRST)
            async with engine.connect() as connection:
                rows = (await connection.execute(sa.select(CauseRow.__table__))).mappings().all()
            made = {row["workspace_id"]: dict(row) for row in rows}
            assert set(made) == {OURS.workspace_id, THEIRS.workspace_id}
            mine, relayrs = made[OURS.workspace_id], made[THEIRS.workspace_id]
            for row in (mine, relayrs):
                at = row.pop("recorded_at")
                at = at if at.tzinfo else at.replace(tzinfo=UTC)
                assert abs(datetime.now(UTC) - at) < timedelta(minutes=1)
                row.pop("workspace_id")
            assert mine == relayrs
        finally:
            await engine.dispose()

    asyncio.run(scenario())
