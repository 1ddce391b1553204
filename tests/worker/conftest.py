"""Fixtures for the pool's tests: a private Redis, and a real pool per SQL backend.

`redis_server` starts a private `redis-server` on a free loopback port for the session, so no
test touches the machine's Redis. `pool` is module-scoped and parametrized over SQLite files and
a PostgreSQL database of its own: a migrated store, one `actonce worker` (prefork, `-c 2`) and
one dispatcher as subprocesses, and a `Runtime` in the test process to publish events and read
what the pool did. Tests share it and isolate themselves by workspace: `scene` gives each test a
fresh artifactr and reflexr workspace of its own. `settings_of` is a migrated store of each backend
for the tests that drive a `Runtime` in-process.
"""

import asyncio
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from pools import POOL_ENV, REDIS_DB, Pool, Scene, broker_url, database, running_pool

from actonce.worker.settings import Settings
from actonce.worker.storage.migrate import migrate
from lab.redis import RedisHandle, find_or_start_redis


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisHandle]:
    """A private `redis-server` for the session, stopped after it."""
    handle = find_or_start_redis(None, directory=tmp_path_factory.mktemp("redis"))
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def pool(
    request: pytest.FixtureRequest,
    redis_server: RedisHandle,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> Iterator[Pool]:
    """A migrated store on the backend, a worker (`-c 2`) and a dispatcher running on it."""
    backend: str = request.param
    env = {**POOL_ENV, "ACTONCE_BROKER_URL": broker_url(redis_server, REDIS_DB[backend])}
    base = tmp_path_factory.mktemp(f"pool-{backend}")
    with running_pool(backend, env, base, postgres_database, workers=1, concurrency=2) as pool:
        yield pool


@pytest.fixture
def scene(pool: Pool, request: pytest.FixtureRequest) -> Scene:
    """A workspace of this test's own on the shared pool."""
    return pool.scene(request.node.name)


@pytest.fixture(params=["sqlite", "postgres"])
def settings_of(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> Iterator[Settings]:
    """Settings of the bench's definition on a migrated store of the backend, no process."""
    env = {"ACTONCE_APP": "bench.definition:app", "ACTONCE_VAR_DIR": str(tmp_path / "var")}
    with database(request.param, postgres_database) as url:
        if url is not None:
            env["ACTONCE_DATABASE_URL"] = url
        made = Settings.from_env(env)
        asyncio.run(migrate(made))
        yield made


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the PostgreSQL pool's cases marked `sqlite_only`: deselected, never skipped.

    SQLite runs every shape of the hostile-input suite; PostgreSQL those whose letters differ by
    store. Deselecting keeps CI's count honest: nothing it collects is skipped.
    """
    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_postgres = callspec is not None and callspec.params.get("pool") == "postgres"
        (dropped if on_postgres and item.get_closest_marker("sqlite_only") else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
