"""The turn marks' look into the turns queue, on a real Redis: a name whose announcement waits
there is not announced again, and a queue longer than the look (`PEEK_LIMIT`) is taken to hold
every name until it is shorter."""

import time
from collections.abc import Iterator
from typing import Final

import pytest
import redis

from actonce.worker.dispatching.sent_marks import PEEK_LIMIT, SentMarks
from lab.redis import RedisHandle

REDIS_DB: Final = 3
"""The private Redis's database this module uses: no other module's."""

QUEUE: Final = "actonce.turns"


@pytest.fixture
def client(redis_server: RedisHandle) -> Iterator["redis.Redis"]:
    """A client of this module's database, emptied before and after."""
    client = redis.Redis.from_url(redis_server.url.rsplit("/", 1)[0] + f"/{REDIS_DB}")
    client.flushdb()
    try:
        yield client
    finally:
        client.flushdb()
        client.close()


def _claim(marks: SentMarks, *names: str) -> list[bool]:
    return marks.claim_keys(list(names), ttl_s=1, queue=QUEUE, named_by=bytes.decode)


def test_a_name_waiting_in_the_queue_is_not_claimed_and_one_missing_is_once(
    client: "redis.Redis",
) -> None:
    # Given a queue as long as the look, one of its messages naming "waiting"
    marks = SentMarks(client, ttl_s=1)
    client.rpush(QUEUE, *[f"other{i}" for i in range(PEEK_LIMIT - 1)], "waiting")
    # Then "waiting" is not claimed, "lost" is, once while its mark lives
    assert _claim(marks, "waiting", "lost") == [False, True]
    assert _claim(marks, "lost") == [False]


def test_a_queue_longer_than_the_look_holds_every_name_until_it_is_shorter(
    client: "redis.Redis",
) -> None:
    # Given a queue one message longer than the look, none naming "lost"
    marks = SentMarks(client, ttl_s=1)
    client.rpush(QUEUE, *[f"other{i}" for i in range(PEEK_LIMIT + 1)])
    # Then "lost" is taken to wait there: not claimed, and its mark set while it does
    assert _claim(marks, "lost") == [False]
    assert client.exists("actonce:lost") == 1
    # When the queue is as long as the look, "lost" is claimed once its mark has lapsed
    client.lpop(QUEUE)
    deadline = time.monotonic() + 5
    while _claim(marks, "lost") != [True]:
        assert time.monotonic() < deadline, "never claimed once the queue was shorter"
        time.sleep(0.1)
