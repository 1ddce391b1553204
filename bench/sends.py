"""CPU per attempt message on the dispatcher's side: one `send_task` at a time, or a batch.

The dispatcher sends the runs a poll found through one kombu publish batch (`Dispatcher._send`);
this measures what that saves, in this process's CPU time, with the pool's own Celery
configuration (JSON, `task-sent` events on) against a private Redis started for the run. Each
round runs every way in rotated order and the medians are printed::

    python -m bench.sends --rounds 3 --messages 3000
"""

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import redis
from celery import Celery

from actonce.worker.app import make_celery
from actonce.worker.dispatching.dispatcher import send_attempt
from actonce.worker.settings import ATTEMPTS_QUEUE, Settings
from lab.redis import find_or_start_redis

WAYS: Final = ("one_by_one", "batch_10", "batch_100")
"""How the messages are sent: each on its own, or in publish batches of 10 or 100."""


def _sender(celery: Celery, way: str) -> Callable[[int, int], None]:
    """A function that sends the messages numbered `start` up to `stop` the given way."""
    size = 0 if way == "one_by_one" else int(way.removeprefix("batch_"))

    def one_by_one(start: int, stop: int) -> None:
        for i in range(start, stop):
            send_attempt(celery, "t", "w", f"fir_{i:016x}")

    def batched(start: int, stop: int) -> None:
        for first in range(start, stop, size):
            with celery.producer_or_acquire() as producer, producer.batch():
                for i in range(first, min(stop, first + size)):
                    send_attempt(celery, "t", "w", f"fir_{i:016x}", producer=producer)

    return batched if size else one_by_one


def measure(celery: Celery, client: redis.Redis, way: str, messages: int) -> float:
    """Send `messages` the given way, after a warm-up; return ms of CPU per message."""
    send = _sender(celery, way)
    client.flushdb()
    send(0, 200)
    client.flushdb()
    began = time.thread_time()
    send(0, messages)
    spent = time.thread_time() - began
    queued = client.llen(ATTEMPTS_QUEUE)
    assert queued == messages, f"{way}: {queued} of {messages} messages queued"
    client.flushdb()
    return 1000 * spent / messages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=3000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        server = find_or_start_redis(None, directory=Path(scratch))
        try:
            url = server.url
            settings = Settings.from_env(
                {"ACTONCE_BROKER_URL": url, "ACTONCE_VAR_DIR": str(Path(scratch) / "var")}
            )
            celery = make_celery(settings)
            client = redis.Redis.from_url(url)
            figures: dict[str, list[float]] = {way: [] for way in WAYS}
            for round_ in range(args.rounds):
                order = WAYS[round_ % len(WAYS) :] + WAYS[: round_ % len(WAYS)]
                for way in order:
                    figures[way].append(measure(celery, client, way, args.messages))
                said = ", ".join(f"{way} {figures[way][-1]:.3f}" for way in WAYS)
                print(f"round {round_ + 1}: {said} ms of CPU per message")
            client.close()
        finally:
            server.stop()
    base = statistics.median(figures["one_by_one"])
    for way in WAYS:
        median = statistics.median(figures[way])
        print(f"{way:<11} {median:.3f} ms of CPU per message ({median / base:.2f}×)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
