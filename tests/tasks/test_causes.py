"""Each write records the run behind it in relayr's SQL ledger, under relayr's kinds and keys.

relayr's follower, in another process, finds a bridged write's cause by what was written: a
proposal or a created artifact by id, a rule's direct edit by `reflexr:<rule>/<artifact>@<version>`,
a message by id. Recorded there, the write rejoins the run's chain one step deeper. The ledger here
is `relayr.sql.SqlLedger` on a SQLite file, as a worker pool shares it.
"""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import artifactr
import pytest
import relayr.outbound
import relayr.sql
from relayr.ledger import Cause, WorkspaceKey
from sqlalchemy import text
from worlds import ALLOWLIST, BOARD, PLAN, RULE, TENANT, Board, Plan, World, make_world

pytestmark = pytest.mark.anyio


@pytest.fixture
async def sql_engine(tmp_path: Path) -> AsyncIterator[Any]:
    """A SQLite file with relayr's tables."""
    engine = relayr.sql.create_sqlite_engine(f"sqlite+aiosqlite:///{tmp_path / 'relayr.db'}")
    await relayr.sql.migrate(engine)
    yield engine
    await engine.dispose()


async def _world(ledger: relayr.sql.SqlLedger) -> World:
    return await make_world(
        artifactr.Workspaces(artifactr.InMemoryStorage(), types=[Board, Plan]), ledger=ledger
    )


def _cause_of(world: World) -> Cause:
    """The cause the run's writes record: its chain, itself, one step deeper than its firing."""
    run = world.run()
    return Cause(
        correlation_id=run.correlation_id, firing_id=run.id, run_id=run.id, depth=run.depth + 1
    )


async def test_a_create_records_its_proposal_and_its_artifact(sql_engine: Any) -> None:
    ledger = relayr.sql.SqlLedger(sql_engine)
    world = await _world(ledger)
    key = WorkspaceKey(TENANT, world.workspace_id)

    artifact_id = await world.outbound().acting(world.reaction(1)).create(Plan(steps={"a": "b"}))

    proposal_id = "prp_" + artifact_id.removeprefix("art_")
    assert await ledger.cause(key, "proposal", proposal_id) == _cause_of(world)
    assert await ledger.cause(key, "artifact", artifact_id) == _cause_of(world)
    assert _cause_of(world).depth == 3 and _cause_of(world).firing_id == "fir_test"


async def test_an_edit_records_its_proposal_and_the_version_it_makes(sql_engine: Any) -> None:
    ledger = relayr.sql.SqlLedger(sql_engine)
    world = await _world(ledger)
    key = WorkspaceKey(TENANT, world.workspace_id)
    acting = world.outbound().acting(world.reaction(1))

    await acting.edit(BOARD, "/entries/k", "v")
    await acting.edit(PLAN, "/steps/k", "v")

    [proposal_id] = (await world.writes()).proposals
    assert await ledger.cause(key, "proposal", proposal_id) == _cause_of(world)
    assert await ledger.cause(key, "edit", f"reflexr:{RULE}/{BOARD}@2") == _cause_of(world)
    assert await ledger.cause(key, "edit", f"reflexr:{RULE}/{PLAN}@2") == _cause_of(world)
    assert await ledger.cause(key, "edit", f"reflexr:{RULE}/{BOARD}@3") is None


async def test_a_notice_records_its_message(sql_engine: Any) -> None:
    ledger = relayr.sql.SqlLedger(sql_engine)
    world = await _world(ledger)
    key = WorkspaceKey(TENANT, world.workspace_id)

    message_id = await world.outbound().acting(world.reaction(1)).notice("hello")

    assert await ledger.cause(key, "message", message_id) == _cause_of(world)


async def _recorded(engine: Any, world: World) -> set[tuple[str, str, str, str, int]]:
    """What the ledger holds for a world's workspace, each with its run's chain checked."""
    async with engine.connect() as connection:
        rows = await connection.execute(
            text(
                "SELECT kind, key, correlation_id, firing_id, run_id, depth FROM relayr_causes "
                "WHERE workspace_id = :workspace_id"
            ),
            {"workspace_id": world.workspace_id},
        )
        recorded = set()
        for kind, key, correlation_id, *run in rows:
            assert correlation_id == world.run().correlation_id, (kind, key)
            recorded.add((kind, key, *run))
        return recorded


async def _writes(acting: Any) -> None:
    await acting.create(Board(entries={"a": "b"}))
    await acting.create(Plan(steps={"a": "b"}))
    await acting.edit(BOARD, "/entries/k", "v")
    await acting.edit(PLAN, "/steps/k", "v")
    await acting.archive(PLAN)
    await acting.notice("hello")
    await acting.notice("hello", thread_id=await acting.create_thread("side"))


async def test_the_same_writes_record_the_same_causes_as_relayrs(sql_engine: Any) -> None:
    ledger = relayr.sql.SqlLedger(sql_engine)
    ours, theirs = await _world(ledger), await _world(ledger)
    relayr_outbound = relayr.outbound.Outbound(
        theirs.artifactr,
        ledger,
        allowlists={RULE: relayr.outbound.Allowlist(**ALLOWLIST.model_dump())},
    )

    await _writes(ours.outbound().acting(ours.reaction(1)))
    await _writes(relayr_outbound.acting(theirs.reaction(1)))

    recorded = await _recorded(sql_engine, ours)
    assert {kind for kind, *_ in recorded} == {"proposal", "artifact", "edit", "message"}
    assert recorded == await _recorded(sql_engine, theirs)
