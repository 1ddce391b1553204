"""Migrating every store, once, at deploy: the lattice packages' tables and actonce's own.

reflexr, artifactr and relayr each ship Alembic migrations with a version table of their own;
actonce's own tables (dead letters, turn requests) have theirs too, in `worker/migrations`, with
the version table `actonce_alembic_version`, so the four never collide in one database. On a
PostgreSQL reflexr store it also installs the dispatcher's nudge trigger
(`worker.dispatching.nudge`). Workers never migrate at start: concurrent migrations of an empty
PostgreSQL database conflict.
"""

from typing import Final

import artifactr.sql
import reflexr.sql
import relayr.sql
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import AsyncEngine

from actonce.worker.dispatching import nudge
from actonce.worker.process.runtime import make_engine
from actonce.worker.settings import STORES, Settings, mask_url
from actonce.worker.storage.unreachable import describe

MIGRATIONS: Final = "actonce.worker:migrations"
"""Where actonce's Alembic scripts are, as Alembic's `package:folder`."""


async def migrate(settings: Settings) -> list[str]:
    """Create or upgrade every store's tables, once, from one place; return what was migrated.

    Run it at deploy (`actonce migrate`), never from each worker. Migrating a database that is up
    to date changes nothing. Each line returned names a store and its URL, password masked.

    Raises:
        MigrationFailed: Naming the store and why, in one line, password masked; the stores
            before it stay migrated.
    """
    engines: dict[str, AsyncEngine] = {}
    done: list[str] = []
    try:
        for store in STORES:
            url = settings.store_url(store)
            try:
                if url not in engines:
                    engines[url] = make_engine(url)
                await _migrate_store(store, engines[url])
            except Exception as failed:
                raise MigrationFailed(f"cannot migrate: {describe(store, url, failed)}") from failed
            done.append(f"{store}: {mask_url(url)}")
    finally:
        for engine in engines.values():
            await engine.dispose()
    return done


class MigrationFailed(RuntimeError):
    """Raised when a store cannot be migrated; the message is one line, the cause chained."""


async def migrate_own_tables(engine: AsyncEngine) -> None:
    """Upgrade actonce's own tables (dead letters, turn requests) to the latest migration.

    Idempotent, in one transaction; tables made by `create_all` before actonce used Alembic are
    adopted as they are.
    """
    async with engine.begin() as connection:
        await connection.run_sync(_upgrade)


# ─── how ──────────────────────────────────────────────────────────────────────


async def _migrate_store(store: str, engine: AsyncEngine) -> None:
    if store == "reflexr":
        await reflexr.sql.migrate(engine)
        await nudge.install(engine)
    elif store == "artifactr":
        await artifactr.sql.migrate(engine)
    elif store == "relayr":
        await relayr.sql.migrate(engine)
    else:
        await migrate_own_tables(engine)


def _upgrade(connection: sa.Connection) -> None:
    config = Config()
    config.set_main_option("script_location", MIGRATIONS)
    config.attributes["connection"] = connection
    command.upgrade(config, "head")
