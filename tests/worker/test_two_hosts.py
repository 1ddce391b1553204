"""Two hosts on one Redis and one PostgreSQL: the pool scales out with no state of its own.

Each "host" is what a machine runs: an `actonce worker` (2 prefork children) and an `actonce
dispatch`, started as real processes with the same settings, so both dispatchers evaluate and
sweep the same workspaces and both workers consume the same queue. reflexr's evaluation lease
and cursors make each event fire once whichever dispatcher evaluates it; the sent marks and the
claim make each run's writes land once whichever worker attempts it. Counted from reflexr's runs
and artifactr's own log.
"""

import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest
from pools import POOL_ENV, Pool, broker_url, running_pool
from test_pool import assert_each_write_once

from lab.pool import LocalPool
from lab.redis import RedisHandle

pytestmark = pytest.mark.slow

WORKSPACES = 4
"""Workspaces the work is spread over, as tenants spread it."""

RUNS_PER_WORKSPACE = 8
"""Events published in each workspace."""


@pytest.fixture(scope="module")
def two_hosts(
    redis_server: RedisHandle,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> Iterator[tuple[Pool, LocalPool]]:
    """The first host (with the test's runtime), and a second on the same Redis and database."""
    env = {**POOL_ENV, "ACTONCE_BROKER_URL": broker_url(redis_server, 12)}
    base = tmp_path_factory.mktemp("two-hosts")
    with (
        running_pool("postgres", env, base, postgres_database, workers=1, concurrency=2) as first,
        LocalPool(first.env, workers=1, concurrency=2, log_dir=base / "second") as second,
    ):
        second.wait_ready(timeout_s=60)
        yield first, second


def test_two_hosts_share_the_work_and_every_write_lands_once(
    two_hosts: tuple[Pool, LocalPool],
) -> None:
    first, second = two_hosts
    # Given work in several workspaces, published where both hosts' dispatchers look
    scenes = [first.scene(f"two-hosts-{i}") for i in range(WORKSPACES)]
    keys = {
        scene.workspace_id: [f"w{i}-{n}" for n in range(RUNS_PER_WORKSPACE)]
        for i, scene in enumerate(scenes)
    }
    for scene in scenes:
        for key in keys[scene.workspace_id]:
            scene.request(key)

    # When both hosts have run it
    for scene in scenes:
        runs = scene.settled(runs=RUNS_PER_WORKSPACE, timeout_s=120.0)

        # Then each event fired one run, which succeeded, and each write landed once
        assert [run.status for run in runs] == ["succeeded"] * RUNS_PER_WORKSPACE, runs
        assert_each_write_once(scene.census(), keys[scene.workspace_id])

    # And both hosts' workers attempted some of it: neither stood idle behind the other
    succeeded = [
        len(re.findall(r"\] succeeded in ", local.log("worker0")))
        for local in (first.local, second)
    ]
    assert all(count > 0 for count in succeeded), succeeded
    assert sum(succeeded) >= WORKSPACES * RUNS_PER_WORKSPACE, succeeded
    for local in (first.local, second):
        assert "dispatcher ready" in local.log("dispatcher"), local.log("dispatcher")[-2000:]
    first.assert_alive()
