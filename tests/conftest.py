"""Fixtures shared by every test: real servers, one fresh database or key space per test."""

import contextlib
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest

from lab.postgres import PostgresUnreachable, fresh_postgres_database


@contextlib.contextmanager
def _test_database() -> Iterator[str]:
    """A fresh PostgreSQL database for tests: skipped on a laptop without a server, failed in CI."""
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(fresh_postgres_database("actonce_test"))
        except PostgresUnreachable as unreachable:
            if os.environ.get("CI"):
                pytest.fail(f"{unreachable}; CI is set, so the PostgreSQL tests must run, not skip")
            pytest.skip(f"{unreachable}; start it (or set CI to make this a failure)")
        yield url


@pytest.fixture(scope="session")
def postgres_database() -> Callable[[], AbstractContextManager[str]]:
    """Make fresh PostgreSQL databases for fixtures of any scope: `with postgres_database() as url`.

    Each is named `actonce_test_<random hex>` and dropped `WITH (FORCE)` afterwards. Without a
    reachable server the test skips on a laptop, and fails when the environment variable `CI` is
    set: CI never passes by skipping.
    """
    return _test_database


@pytest.fixture
def postgres_url(postgres_database: Callable[[], AbstractContextManager[str]]) -> Iterator[str]:
    """Yield the SQLAlchemy URL of a fresh, empty PostgreSQL database, dropped after the test."""
    with postgres_database() as url:
        yield url
