"""A no-op Celery task on the pool's Redis, configured as actonce's attempts are: the ceiling.

The worker: `BENCH_NOOP_BROKER=redis://… celery -A bench.noop worker -Q bench.noop -c 2`.
Each task increments one Redis counter, so the bench knows when all have run without results.
"""

import os
from typing import Any, Final

import redis
from celery import Celery

QUEUE: Final = "bench.noop"
TASK: Final = "bench.noop"
COUNTER: Final = "bench:noop:done"

BROKER: Final = os.environ.get("BENCH_NOOP_BROKER", "redis://127.0.0.1:6379/0")

app = Celery("bench-noop")
app.conf.update(
    broker_url=BROKER,
    task_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
)

_client: redis.Redis | None = None


@app.task(name=TASK)
def noop(**_: Any) -> None:
    """Do nothing but count."""
    global _client
    if _client is None:
        _client = redis.Redis.from_url(BROKER)
    _client.incr(COUNTER)
