"""`ACTONCE_RESULT_BACKEND_URL`: a real worker keeps task results in that Redis, not the broker's.

The dispatcher sends attempts with their results ignored (reflexr's run is the outcome), so the
test sends one attempt the way a Celery client would, asking for its result, and reads where the
worker put it.
"""

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Final

import pytest
import redis
from pools import POOL_ENV, TENANT, Pool, broker_url, flush, running_pool

from actonce.tasks.attempt import ATTEMPT_TASK
from actonce.worker.settings import ATTEMPTS_QUEUE
from lab.redis import RedisHandle

pytestmark = pytest.mark.slow

BROKER_DB: Final = 8
RESULTS_DB: Final = 9
"""The private Redis's databases this module uses: the queues', and the results'."""


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisHandle,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> Iterator[Pool]:
    """A pool on SQLite whose results go to a Redis database apart from its broker's."""
    results_url = broker_url(redis_server, RESULTS_DB)
    flush(results_url)
    env = {
        **POOL_ENV,
        "ACTONCE_BROKER_URL": broker_url(redis_server, BROKER_DB),
        "ACTONCE_RESULT_BACKEND_URL": results_url,
    }
    base: Path = tmp_path_factory.mktemp("results")
    with running_pool("sqlite", env, base, postgres_database, workers=1, concurrency=1) as pool:
        yield pool
    flush(results_url)


def test_a_tasks_result_is_kept_in_the_result_backend_and_not_the_broker(pool: Pool) -> None:
    # Given a run the pool attempted and finished
    scene = pool.scene("results")
    scene.request("kept")
    (run,) = scene.settled()

    # When a client sends an attempt of it asking for the result
    sent = pool.local.celery.send_task(
        ATTEMPT_TASK,
        kwargs={"tenant_id": TENANT, "workspace_id": scene.workspace_id, "run_id": run.id},
        queue=ATTEMPTS_QUEUE,
    )

    # Then the worker's result (a duplicate, declined) is in the results' Redis database only
    assert sent.get(timeout=30)["outcome"] == "not_claimed"
    key = f"celery-task-meta-{sent.id}"
    with redis.Redis.from_url(pool.env["ACTONCE_RESULT_BACKEND_URL"]) as results:
        assert results.exists(key)
    with redis.Redis.from_url(pool.env["ACTONCE_BROKER_URL"]) as broker:
        assert not broker.exists(key)
        assert not broker.keys("celery-task-meta-*")
