"""A store that goes away under an attempt, for real: the task retries instead of failing.

A dead run's letter is written after the run's outcome is committed. If the database drops the
task's connection in between, nothing would ever send that finished run again: the task must
retry, and its next delivery write the letter. `make chaos` lost one letter so when it crashed
its database (on 508c087); here the cut is made deterministic. The test holds the dead-letter
table locked, waits until the worker's insert waits on the lock, and terminates that backend.
"""

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from pools import (
    POOL_ENV,
    TENANT,
    Pool,
    broker_url,
    drop_the_waiting_connection,
    running_pool,
    wait_until,
)

from actonce.worker.dead_letters.store import TABLE_NAME
from demo.definition import WorkRequested
from demo.feed import request_work
from lab.redis import RedisHandle

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisHandle,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> Iterator[Pool]:
    """A pool on a PostgreSQL database of its own: one worker, one child, a dispatcher."""
    env = {**POOL_ENV, "ACTONCE_BROKER_URL": broker_url(redis_server, 14)}
    base: Path = tmp_path_factory.mktemp("outage")
    with running_pool("postgres", env, base, postgres_database, workers=1, concurrency=1) as pool:
        yield pool


def test_a_connection_lost_before_the_dead_letter_is_retried_and_the_letter_kept(
    pool: Pool,
) -> None:
    scene = pool.scene("outage")

    async def a_run_dies() -> None:
        event = WorkRequested(key="cut", die=True)
        await request_work(pool.runtime.reflexr, TENANT, scene.workspace_id, event)

    # Given the dead-letter table locked, when a run dies and its task's write of the letter
    # waits on the lock, and the database drops that connection
    url = pool.env["ACTONCE_DATABASE_URL"]
    pool.run(drop_the_waiting_connection(url, TABLE_NAME, a_run_dies))

    # Then the run is dead once, its letter is kept, and the task retried before it failed
    (run,) = scene.settled()
    assert (run.status, run.attempts) == ("dead", 1), run
    letter = scene.letter_of(run.id, timeout_s=20)
    assert letter.task_id is not None
    task_id = letter.task_id
    wait_until(lambda: pool.final_state(task_id) == "FAILURE", "the task to fail")
    assert pool.task_states(task_id) == ["RETRY", "FAILURE"], pool.worker_log()
    assert "a store went away (DBAPIError); retrying in 1s" in pool.worker_log()
    pool.assert_alive()
