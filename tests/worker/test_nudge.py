"""The nudge, for real: on PostgreSQL an append wakes the dispatcher; it does not wait for a poll.

`actonce migrate` installs a trigger on reflexr's events table; a real `actonce dispatch` whose
poll interval is 30 s then fires and sends a run within seconds of its event, which only the
notification can explain, and a real worker finishes it. With `ACTONCE_LINGER_S` the woken
dispatcher waits that long first, and the appends within it share one evaluation.
"""

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from pools import POOL_ENV, Pool, Scene, broker_url, execute, running_pool, wait_until

from actonce.worker.dispatching.nudge import FUNCTION, Nudges
from actonce.worker.dispatching.rule_listeners import OWN_FACTS
from actonce.worker.process.health import HEARTBEAT_PREFIX
from actonce.worker.process.runtime import make_engine
from demo.definition import WorkRequested
from demo.feed import FEED
from lab.pool import LocalPool
from lab.redis import RedisHandle

pytestmark = pytest.mark.slow

POLL_S = 30
"""The dispatcher's poll interval and sweep here: far longer than the test waits."""


def _env(
    redis_server: RedisHandle,
    db: int,
    *,
    poll_s: float = POLL_S,
    sweep_s: float = POLL_S,
    **settings: str,
) -> dict[str, str]:
    """A pool's settings here: the quick ones (`POOL_ENV`), this poll interval and sweep,
    database `db` of the private Redis for its broker, and `settings`."""
    return {
        **POOL_ENV,
        "ACTONCE_POLL_INTERVAL_S": str(poll_s),
        "ACTONCE_SWEEP_INTERVAL_S": str(sweep_s),
        "ACTONCE_BROKER_URL": broker_url(redis_server, db),
        **settings,
    }


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisHandle,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> Iterator[Pool]:
    """A migrated PostgreSQL database, a worker and a dispatcher that polls every 30 s."""
    env = _env(redis_server, 9)
    base = tmp_path_factory.mktemp("nudge")
    with running_pool("postgres", env, base, postgres_database, workers=1, concurrency=2) as pool:
        yield pool


def test_migrate_installs_the_nudge_trigger_on_reflexrs_events(pool: Pool) -> None:
    # Given the database `actonce migrate` prepared; when its triggers are listed
    async def triggers() -> list[str]:
        engine = make_engine(pool.env["ACTONCE_DATABASE_URL"])
        try:
            async with engine.connect() as connection:
                query = sa.text(
                    "SELECT tgname FROM pg_trigger WHERE tgrelid = 'reflexr_events'::regclass"
                    " AND NOT tgisinternal"
                )
                return list((await connection.execute(query)).scalars())
        finally:
            await engine.dispose()

    # Then the nudge is one of them
    assert FUNCTION in asyncio.run(triggers())


def test_an_append_is_dispatched_without_waiting_for_the_next_poll(
    scene: Scene, pool: Pool
) -> None:
    # Given a dispatcher that has made its first polls and will not poll again for 30 s
    # (its ready line comes after the first poll; listening begins right after it)
    # When an event is published
    scene.request("nudged")

    # Then its run is fired, sent and finished well before a poll could have found it
    (run,) = scene.settled(runs=1, timeout_s=POLL_S / 3)
    assert run.status == "succeeded", run
    pool.assert_alive()


def test_without_a_linger_each_append_gets_an_evaluation_of_its_own(
    scene: Scene, pool: Pool
) -> None:
    # Given the dispatcher with the default linger (none), polling every 30 s
    # When three requests are published a little apart
    _publish_apart(scene, ("one", "two", "three"))

    # Then each was fired by an evaluation of its own: reflexr dates the runs an evaluation's
    # transaction fires with that transaction's time
    runs = scene.settled(runs=3, timeout_s=POLL_S / 3)
    assert len({run.created_at for run in runs}) == 3, [run.created_at for run in runs]


def test_appends_within_the_linger_share_one_evaluation(
    redis_server: RedisHandle,
    tmp_path: Path,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> None:
    # Given a dispatcher that waits 2 s after an append wakes it, and polls every 30 s
    env = _env(redis_server, 10, ACTONCE_LINGER_S="2")
    with running_pool(
        "postgres", env, tmp_path, postgres_database, workers=1, concurrency=2
    ) as pool:
        scene = pool.scene("linger")
        # When three requests are published a little apart, the first waking it
        published = time.time()
        _publish_apart(scene, ("one", "two", "three"))
        runs = scene.settled(runs=3, timeout_s=POLL_S / 3)
        pool.assert_alive()

    # Then one evaluation, the linger after the first append, fired all three, and each run
    # succeeded
    assert len({run.created_at for run in runs}) == 1, [run.created_at for run in runs]
    assert runs[0].created_at.timestamp() - published >= 1.5, (runs[0].created_at, published)
    assert {run.status for run in runs} == {"succeeded"}


def _publish_apart(scene: Scene, keys: tuple[str, ...], apart_s: float = 0.3) -> None:
    """Publish a request per key, `apart_s` apart: far longer than an evaluation takes."""
    for i, key in enumerate(keys):
        if i:
            time.sleep(apart_s)
        scene.request(key)


def test_a_notification_of_types_no_rule_hears_wakes_nothing(scene: Scene, pool: Pool) -> None:
    # Given two listeners: one for which the demo's requests are quiet, and the facts the pool
    # appends as it fires and attempts their runs (which may reach it first), one for which
    # none is
    async def scenario() -> tuple[bool, bool]:
        engine = pool.runtime.engine("reflexr")
        deaf = Nudges(engine, frozenset({WorkRequested.event_type}) | OWN_FACTS)
        hearing = Nudges(engine)
        try:
            for nudges in (deaf, hearing):
                await nudges.listen()
                await nudges.wait(0)  # listening starts heard: a poll looks at once
            # When a request is appended
            opened = await pool.runtime.reflexr.open("t_pool", scene.workspace_id, actor=FEED)
            await opened.publish(WorkRequested(key="heard"))
            # Then both were notified, and only the listener that may hear it woke
            woke = await hearing.wait(10)
            deadline = asyncio.get_running_loop().time() + 10
            while deaf.received == 0:
                assert asyncio.get_running_loop().time() < deadline, "no notification came"
                await asyncio.sleep(0.05)
            return woke, await deaf.wait(0)
        finally:
            await deaf.close()
            await hearing.close()

    assert pool.run(scenario()) == (True, False)


def test_idle_polls_come_at_the_sweep_while_listening_and_at_full_rate_without_the_trigger(
    redis_server: RedisHandle,
    tmp_path: Path,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> None:
    # Given a pool on PostgreSQL with the default poll (0.1 s) and sweep (0.5 s)
    env = _env(redis_server, 13, poll_s=0.1, sweep_s=0.5)
    with running_pool(
        "postgres", env, tmp_path, postgres_database, workers=1, concurrency=1
    ) as pool:
        processes = pool.local
        # When it is idle and listening for appends
        line = "listening for appends; polling every 0.5s"
        wait_until(_logged(processes, line), f"the line {line!r}", timeout_s=30)
        listening = _polls_per_second(env["ACTONCE_BROKER_URL"])
        # And when, the trigger gone, its dispatcher is started again
        pool.run(
            execute(pool.env["ACTONCE_DATABASE_URL"], f"DROP TRIGGER {FUNCTION} ON reflexr_events")
        )
        assert processes.stop_process("dispatcher", timeout_s=15)
        before = len(processes.log("dispatcher"))
        assert processes.revive() == ["dispatcher"]
        wait_until(_logged(processes, "dispatching to", before), "the ready line", timeout_s=30)
        unheard = _polls_per_second(env["ACTONCE_BROKER_URL"])
        log = processes.log("dispatcher")[before:]

    # Then the listening one polled about twice a second, and the other says why it polls ten
    # times a second
    assert 1.0 <= listening <= 3.0, listening
    assert unheard >= 5.0, unheard
    assert "no nudge trigger on reflexr's events table (run `actonce migrate`)" in log
    assert "listening for appends; polling every" not in log


def _logged(processes: LocalPool, line: str, after: int = 0) -> Callable[[], bool]:
    """Whether the dispatcher has logged `line` past the first `after` characters of its log."""
    return lambda: line in processes.log("dispatcher")[after:]


def _polls_per_second(url: str, seconds: float = 4.0) -> float:
    """The polls a second of the one dispatcher beating its heartbeat at `url`, over `seconds`
    or more, from its heartbeats (written at most every second, with its count of polls)."""
    client = redis.Redis.from_url(url)

    def beat() -> tuple[float, int]:
        deadline = time.monotonic() + 10
        while True:
            beats = [
                json.loads(client.get(key) or b"{}") for key in client.keys(f"{HEARTBEAT_PREFIX}*")
            ]
            live = [b for b in beats if b and time.time() - b["at"] < 2.5]
            if len(live) == 1:
                return float(live[0]["at"]), int(live[0]["polls"])
            assert time.monotonic() < deadline, f"not one live heartbeat: {beats}"
            time.sleep(0.1)

    try:
        first = beat()
        time.sleep(seconds)
        last = beat()
        while last[0] == first[0]:
            time.sleep(0.2)
            last = beat()
    finally:
        client.close()
    return (last[1] - first[1]) / (last[0] - first[0])
