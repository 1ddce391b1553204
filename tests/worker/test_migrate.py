"""`actonce migrate` makes actonce's own tables with Alembic, beside the lattice packages' tables.

Through the command an operator types, on an empty SQLite folder and an empty PostgreSQL
database: every store's tables appear, actonce's version is kept in `actonce_alembic_version`
(apart from reflexr's, artifactr's and relayr's), migrating again changes nothing and keeps the
rows, the tables the migrations make are the ones the code declares, a database whose tables
were made by `create_all` before the migrations existed is adopted, and the URL it prints never
shows a password.
"""

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from click.testing import CliRunner, Result
from sqlalchemy.engine import make_url

from actonce.tasks.turns import SqlTurnRequests
from actonce.worker.cli import main
from actonce.worker.dead_letters.store import DEAD_LETTERS_TABLE, DeadLetter, SqlDeadLetters
from actonce.worker.migrations import OWN_METADATA, VERSION_TABLE
from actonce.worker.process.runtime import make_engine
from actonce.worker.storage.migrate import migrate_own_tables

OWN_TABLES = {"actonce_dead_letters", "actonce_turn_requests"}
VERSION_TABLES = {
    "reflexr_alembic_version",
    "artifactr_alembic_version",
    "relayr_alembic_version",
    VERSION_TABLE,
}


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[str]:
    """The URL of actonce's empty store, set up for `actonce migrate`: SQLite files, or a fresh
    PostgreSQL database that holds every store."""
    monkeypatch.setenv("ACTONCE_VAR_DIR", str(tmp_path))
    if request.param == "sqlite":
        monkeypatch.delenv("ACTONCE_DATABASE_URL", raising=False)
        yield f"sqlite+aiosqlite:///{tmp_path / 'actonce.db'}"
        return
    url: str = request.getfixturevalue("postgres_url")
    monkeypatch.setenv("ACTONCE_DATABASE_URL", url)
    yield url


def test_migrate_makes_actonces_tables_beside_every_stores_own(store_url: str) -> None:
    result = _migrate()

    assert result.exit_code == 0, result.output
    assert [line.split(":")[0] for line in result.output.splitlines()] == [
        "migrated reflexr",
        "migrated artifactr",
        "migrated relayr",
        "migrated actonce",
    ]
    tables = _inspect(store_url, lambda inspector, _: set(inspector.get_table_names()))
    assert OWN_TABLES | {VERSION_TABLE} <= tables, tables
    assert _version(store_url) == ["0003"]
    if store_url.startswith("postgresql"):  # one database holds every store's version table
        assert tables >= VERSION_TABLES, tables


def test_migrating_twice_changes_nothing_and_keeps_the_rows(store_url: str) -> None:
    assert _migrate().exit_code == 0
    letter = _a_letter()
    assert _with_engine(store_url, lambda engine: SqlDeadLetters(engine).add(letter))

    again = _migrate()

    assert again.exit_code == 0, again.output
    assert _version(store_url) == ["0003"]
    kept = _with_engine(store_url, lambda engine: SqlDeadLetters(engine).get(letter.id))
    assert kept == letter, "migrating again should keep the letters"


def test_the_migrated_tables_are_the_tables_the_code_declares(store_url: str) -> None:
    assert _migrate().exit_code == 0

    differences = _inspect(
        store_url,
        lambda _, connection: compare_metadata(
            MigrationContext.configure(connection), list(OWN_METADATA)
        ),
    )

    ours = [d for d in differences if _names_our_table(d)]
    assert ours == [], f"the migrations and the tables in the code disagree: {ours}"


def test_a_database_made_before_the_migrations_is_adopted_with_its_rows(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'actonce.db'}"
    letter = _a_letter()

    async def made_by_create_all_then_migrated() -> DeadLetter | None:
        engine = make_engine(url)
        try:
            async with engine.begin() as connection:
                await connection.run_sync(DEAD_LETTERS_TABLE.metadata.create_all)
            await SqlDeadLetters(engine).add(letter)
            await migrate_own_tables(engine)
            return await SqlDeadLetters(engine).get(letter.id)
        finally:
            await engine.dispose()

    assert asyncio.run(made_by_create_all_then_migrated()) == letter
    assert _version(url) == ["0003"]
    assert _inspect(url, lambda inspector, _: set(inspector.get_table_names())) >= OWN_TABLES


def test_turn_requests_made_before_0003_keep_their_rows_and_are_due_at_once(
    tmp_path: Path,
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'actonce.db'}"

    async def made_at_0002_then_migrated() -> Any:
        engine = make_engine(url)
        try:
            async with engine.begin() as connection:
                await connection.run_sync(_upgrade_to, "0002")
                await connection.execute(
                    sa.text(
                        "INSERT INTO actonce_turn_requests (tenant_id, workspace_id, message_id, "
                        "thread_id, rule, requested_at, asks) VALUES ('acme', 'ws_old', "
                        "'msg_old', 'thr_old', 'ops:old', '2026-03-01 12:00:00', 2)"
                    )
                )
            await migrate_own_tables(engine)
            return await SqlTurnRequests(engine).get("acme", "ws_old", "msg_old")
        finally:
            await engine.dispose()

    kept = asyncio.run(made_at_0002_then_migrated())
    assert kept is not None and kept.asks == 2
    assert (kept.asked_at, kept.due_at) == (None, None)
    assert _version(url) == ["0003"]


def test_migrate_never_prints_the_databases_password(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The machine's PostgreSQL trusts local connections, so a password is accepted and unused.
    with_password = make_url(postgres_url).set(password="s3cret-pw")
    monkeypatch.setenv("ACTONCE_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("ACTONCE_DATABASE_URL", with_password.render_as_string(hide_password=False))

    result = _migrate()

    assert result.exit_code == 0, result.output
    assert "s3cret-pw" not in result.output
    assert ":***@" in result.output, result.output


# ─── how ──────────────────────────────────────────────────────────────────────


def _migrate() -> Result:
    return CliRunner().invoke(main, ["migrate"], prog_name="actonce")


def _a_letter() -> DeadLetter:
    from datetime import UTC, datetime

    return DeadLetter(
        id="dl_kept",
        tenant_id="acme",
        workspace_id="ws_migrate",
        run_id="fir_kept",
        rule="demo:work",
        reason="forbidden",
        error="no",
        attempts=1,
        dead_at=datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
    )


def _with_engine[T](url: str, use: Callable[[Any], Any]) -> Any:
    async def scenario() -> Any:
        engine = make_engine(url)
        try:
            return await use(engine)
        finally:
            await engine.dispose()

    return asyncio.run(scenario())


def _inspect[T](url: str, look: Callable[[sa.Inspector, sa.Connection], T]) -> T:
    async def scenario() -> T:
        engine = make_engine(url)
        try:
            async with engine.connect() as connection:
                return await connection.run_sync(lambda sync: look(sa.inspect(sync), sync))
        finally:
            await engine.dispose()

    return asyncio.run(scenario())


def _version(url: str) -> list[str]:
    return _inspect(
        url,
        lambda _, connection: [
            row[0]
            for row in connection.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}"))
        ],
    )


def _upgrade_to(connection: sa.Connection, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    from actonce.worker.storage.migrate import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", MIGRATIONS)
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


def _names_our_table(difference: Any) -> bool:
    # compare_metadata also reports every other store's tables as not in our metadata.
    text = repr(difference)
    return any(table in text for table in OWN_TABLES)


def test_a_stores_own_url_puts_its_tables_there_and_the_rest_in_the_shared_database(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given one database for the stores, and relayr's cause ledger in another
    shared = f"sqlite+aiosqlite:///{tmp_path / 'shared.db'}"
    ledger = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv("ACTONCE_VAR_DIR", str(tmp_path / "var"))
    monkeypatch.setenv("ACTONCE_DATABASE_URL", shared)
    monkeypatch.setenv("ACTONCE_RELAYR_URL", ledger)
    # When `actonce migrate` runs
    result = _migrate()
    assert result.exit_code == 0, result.output
    # Then relayr's tables are in the ledger's database alone, every other store's in the shared
    in_shared, in_ledger = _table_names(shared), _table_names(ledger)
    assert "relayr_alembic_version" in in_ledger and "relayr_alembic_version" not in in_shared
    assert {"reflexr_alembic_version", "artifactr_alembic_version", VERSION_TABLE} <= in_shared
    assert not {"reflexr_alembic_version", VERSION_TABLE} & in_ledger, in_ledger
    assert in_shared >= OWN_TABLES and not OWN_TABLES & in_ledger
    assert not (tmp_path / "var").exists()  # no store fell back to the default SQLite files


def _table_names(url: str) -> set[str]:
    return _inspect(url, lambda inspector, _: set(inspector.get_table_names()))
