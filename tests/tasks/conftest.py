"""Fixtures for the act-once tests: each artifactr store in turn, and a fresh world over it.

`world` runs a test over artifactr's in-memory store and over its SQLite store (a migrated file
under `tmp_path`); `memory_world` over the in-memory store only. See `worlds.py`.
"""

from collections.abc import AsyncIterator
from pathlib import Path

import artifactr
import artifactr.sql
import pytest
from worlds import Board, Plan, World, make_world


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["memory", "sqlite"])
async def artifactr_workspaces(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[artifactr.Workspaces]:
    """artifactr's workspaces over its in-memory store, then over a SQLite file."""
    if request.param == "memory":
        yield artifactr.Workspaces(artifactr.InMemoryStorage(), types=[Board, Plan])
        return
    engine = artifactr.sql.create_sqlite_engine(f"sqlite+aiosqlite:///{tmp_path / 'artifactr.db'}")
    await artifactr.sql.migrate(engine)
    yield artifactr.Workspaces(artifactr.sql.SqlStorage(engine), types=[Board, Plan])
    await engine.dispose()


@pytest.fixture
async def world(artifactr_workspaces: artifactr.Workspaces) -> World:
    """A fresh workspace over each artifactr store."""
    return await make_world(artifactr_workspaces)


@pytest.fixture
async def memory_world() -> World:
    """A fresh workspace over artifactr's in-memory store only."""
    return await make_world(artifactr.Workspaces(artifactr.InMemoryStorage(), types=[Board, Plan]))
