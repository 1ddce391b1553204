"""The `threads` pool, for real: attempts overlap in one process, and a killed process loses none.

A worker started `actonce worker --pool threads -c 4` runs its attempts on one event loop in one
process, so an attempt waiting on its action or the stores leaves the others running. What it
gives up against prefork is isolation inside the process: a killed process takes every attempt
it had in flight with it. These tests prove those attempts are not lost: the dispatcher's sweep
sends each run again once its lease lapsed, the claim records the killed attempt abandoned, and
the second attempt finishes the run with each write once. Real Redis, a real worker process and
the real dispatcher, over SQLite files and over PostgreSQL, counted from artifactr's own log.
"""

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest
from pools import POOL_ENV, REDIS_DB, Pool, Scene, broker_url, running_pool
from reflexr.core import Run
from test_pool import assert_each_write_once

from lab.redis import RedisHandle

pytestmark = pytest.mark.slow

IN_FLIGHT = 4
"""Attempts in flight in the one worker process (`-c`)."""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def pool(
    request: pytest.FixtureRequest,
    redis_server: RedisHandle,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> Iterator[Pool]:
    """A migrated store on the backend, one `threads` worker and a dispatcher running on it."""
    backend: str = request.param
    # Its own Redis database: the prefork pool's modules use 1 and 2. The pool is chosen as an
    # operator would in compose, by `ACTONCE_POOL` (the bench passes `-P threads`).
    env = {
        **POOL_ENV,
        "ACTONCE_BROKER_URL": broker_url(redis_server, REDIS_DB[backend] + 4),
        "ACTONCE_POOL": "threads",
    }
    base = tmp_path_factory.mktemp(f"threads-{backend}")
    with running_pool(
        backend, env, base, postgres_database, workers=1, concurrency=IN_FLIGHT, pool=None
    ) as pool:
        yield pool


def test_one_threads_process_finishes_runs_while_another_attempt_waits(
    scene: Scene, pool: Pool
) -> None:
    # Given a run whose first attempt made its notice and now waits 30 s, in the one process
    scene.request("lingering", slow_s=30.0)
    (lingering,) = wait_for(scene, lambda runs: [r for r in runs if r.status == "running"], 1)

    # When three more runs come
    for key in ("one", "two", "three"):
        scene.request(key)

    # Then the same process finishes them while the first attempt is still waiting, and it has
    # no child processes: its attempts run in its own threads
    wait_for(scene, lambda runs: [r for r in runs if r.status == "succeeded"], 3)
    assert list(pool.local.worker_children().values()) == [[]], pool.local.worker_children()
    still = {run.id: run for run in scene.runs()}[lingering.id]
    assert (still.status, still.attempts) == ("running", 1), still

    # And when the process dies with that attempt in flight, the run is finished once elsewhere
    pool.local.kill_worker()
    assert pool.local.revive() == ["worker0"]
    pool.local.wait_ready(timeout_s=60)
    runs = scene.settled(runs=4, timeout_s=60)
    assert [run.status for run in runs] == ["succeeded"] * 4, runs
    assert {run.id: run for run in runs}[lingering.id].attempts >= 2
    assert_each_write_once(scene.census(), ["lingering", "one", "two", "three"])


def test_a_killed_threads_process_loses_none_of_its_attempts(scene: Scene, pool: Pool) -> None:
    # Given as many runs as the process keeps in flight, each past its first write and waiting
    keys = [f"inflight{i}" for i in range(IN_FLIGHT)]
    for key in keys:
        scene.request(key, slow_s=30.0)
    wait_for(scene, lambda runs: [r for r in runs if r.status == "running"], IN_FLIGHT)
    assert_notices(scene, IN_FLIGHT)

    # When the worker process is killed with all of them in flight, and its supervisor restarts it
    pool.local.kill_worker()
    pool.local.revive()
    pool.local.wait_ready(timeout_s=60)

    # Then each run is taken over once its lease lapsed and finished by later attempts (more
    # than one when their edits of the shared timeline meet version conflicts), and every write
    # is in artifactr's log once
    runs = scene.settled(runs=IN_FLIGHT, timeout_s=90)
    assert [run.status for run in runs] == ["succeeded"] * IN_FLIGHT, runs
    assert all(run.attempts >= 2 for run in runs), runs
    assert_each_write_once(scene.census(), keys)
    pool.assert_alive()


def wait_for(
    scene: Scene, pick: Callable[[list[Run]], list[Run]], count: int, timeout_s: float = 30.0
) -> list[Run]:
    """Poll the scene's runs until `pick` finds `count` of them; return those."""
    deadline = time.monotonic() + timeout_s
    while len(found := pick(scene.runs())) < count:
        assert time.monotonic() < deadline, f"{count} runs expected, found {scene.runs()}"
        time.sleep(0.1)
    return found


def assert_notices(scene: Scene, count: int, timeout_s: float = 30.0) -> None:
    """Wait until the scene's log holds `count` notices: each attempt made its first write."""
    deadline = time.monotonic() + timeout_s
    while len(scene.census().messages) < count:
        assert time.monotonic() < deadline, f"{count} notices expected: {scene.census().messages}"
        time.sleep(0.1)
