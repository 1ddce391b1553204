"""Fair share's settings, on a serving dispatcher with no worker: `ACTONCE_FAIR_WEIGHTS` orders
its sends, `ACTONCE_FAIR_TENANT_MAX_IN_FLIGHT` caps a tenant's messages, and the queue holds
`ACTONCE_FAIR_QUEUED_PER_CHILD` per child of `ACTONCE_CONCURRENCY` while the rest waits its turn.

A real private Redis holds the attempts queue; the stores are SQLite files. No worker runs, so
what waits in the queue is what the dispatcher sent, and a test plays the workers by removing
messages from it.
"""

import asyncio
import base64
import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from reflexr.core import SourceActor

from actonce.worker.app import make_celery
from actonce.worker.definition import load_definition
from actonce.worker.dispatching.dispatcher import Dispatcher
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import ATTEMPTS_QUEUE, Settings
from actonce.worker.storage.migrate import migrate
from bench.definition import BenchRequested
from lab.redis import RedisHandle

FEED = SourceActor(name="fair-settings-feed")


@pytest.fixture
def fair_env(redis_server: RedisHandle, tmp_path: Path) -> Iterator[dict[str, str]]:
    url = redis_server.url.rsplit("/", 1)[0] + "/15"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield {
        "ACTONCE_APP": "bench.definition:app",
        "ACTONCE_BROKER_URL": url,
        "ACTONCE_VAR_DIR": str(tmp_path / "var"),
        "ACTONCE_SWEEP_INTERVAL_S": "2",
    }
    client.flushdb()
    client.close()


def test_a_weighted_tenant_sends_its_weight_in_each_turn_and_the_rest_waits_its_turn(
    fair_env: dict[str, str],
) -> None:
    # Given a tenant of weight 3, and a queue of room for 2 per child of 2 children (4)
    env = {
        **fair_env,
        "ACTONCE_FAIR_WEIGHTS": "t_big=3",
        "ACTONCE_CONCURRENCY": "2",
        "ACTONCE_FAIR_QUEUED_PER_CHILD": "2",
    }
    url = env["ACTONCE_BROKER_URL"]
    with _dispatching(env) as (runtime, dispatcher):

        async def scenario() -> None:
            # While the queue is full (of four messages no attempt of theirs), ten runs of
            # each tenant come due
            _push_others(url, 4)
            await _publish(runtime, "t_big", 10)
            await _publish(runtime, "t_small", 10)
            await dispatcher.poll()
            assert _queued_tenants(url) == {}
            # When the workers take those four, and the dispatcher serves
            _drop_queue(url)
            await _serving(dispatcher, until=lambda: sum(_queued_tenants(url).values()) >= 4)

        runtime.run(scenario())
    # Then the queue holds three of the heavy tenant's for one of the other's, and no more
    assert _queued_tenants(url) == {"t_big": 3, "t_small": 1}


def test_a_tenant_at_its_cap_of_attempts_in_flight_waits_until_one_settles(
    fair_env: dict[str, str],
) -> None:
    # Given a cap of 2 attempts in flight a tenant, and room for 20 in the queue
    env = {
        **fair_env,
        "ACTONCE_FAIR_TENANT_MAX_IN_FLIGHT": "2",
        "ACTONCE_FAIR_QUEUED_PER_CHILD": "10",
    }
    url = env["ACTONCE_BROKER_URL"]
    with _dispatching(env) as (runtime, dispatcher):

        async def scenario() -> None:
            # When five runs of each of two tenants come due
            await _publish(runtime, "t_a", 5)
            await _publish(runtime, "t_b", 5)
            await dispatcher.poll()
            # Then two of each go to the queue
            assert _queued_tenants(url) == {"t_a": 2, "t_b": 2}
            # And when a worker takes one of t_a's and settles it, one more of t_a's goes
            _pop_one(url)
            await _serving(dispatcher, until=lambda: sum(_queued_tenants(url).values()) >= 4)

        runtime.run(scenario())
    assert sorted(_queued_tenants(url).items()) == [("t_a", 2), ("t_b", 2)]


# ─── how ──────────────────────────────────────────────────────────────────────


@contextlib.contextmanager
def _dispatching(env: dict[str, str]) -> Iterator[tuple[Runtime, Dispatcher]]:
    settings = Settings.from_env(env)
    asyncio.run(migrate(settings))
    runtime = Runtime(settings, load_definition(settings.app), one_run=False).open()
    dispatcher = Dispatcher(runtime, make_celery(settings))
    try:
        yield runtime, dispatcher
    finally:
        runtime.run(dispatcher.close())
        runtime.close()


async def _publish(runtime: Runtime, tenant: str, count: int) -> None:
    opened = await runtime.reflexr.open(tenant, "w", actor=FEED)
    await opened.publish_many([BenchRequested(key=f"{tenant}{i}") for i in range(count)])


async def _serving(dispatcher: Dispatcher, *, until: Callable[[], bool]) -> None:
    """Serve until `until()` holds, then half a second more (no more may go), and stop."""
    stop = asyncio.Event()
    serving = asyncio.ensure_future(dispatcher.serve(stop))
    deadline = time.monotonic() + 20
    try:
        while not until():
            assert time.monotonic() < deadline, "the dispatcher sent nothing more in 20 s"
            assert not serving.done(), serving.result()
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
    finally:
        stop.set()
        await serving


def _queued_tenants(url: str) -> Counter[str]:
    """The tenants of the attempt messages waiting in the queue."""
    with redis.Redis.from_url(url) as client:
        items = client.lrange(ATTEMPTS_QUEUE, 0, -1)
    tenants: Counter[str] = Counter()
    for item in items:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            body = json.loads(base64.b64decode(json.loads(item)["body"]))
            tenants[body[1]["tenant_id"]] += 1
    return tenants


def _push_others(url: str, count: int) -> None:
    with redis.Redis.from_url(url) as client:
        client.lpush(ATTEMPTS_QUEUE, *[b"not an attempt"] * count)


def _drop_queue(url: str) -> None:
    with redis.Redis.from_url(url) as client:
        client.delete(ATTEMPTS_QUEUE)


def _pop_one(url: str) -> None:
    """Take the oldest message, as a worker would, and settle it: gone from Redis."""
    with redis.Redis.from_url(url) as client:
        client.rpop(ATTEMPTS_QUEUE)
