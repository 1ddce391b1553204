"""Attempts in flight by tenant: the attempt messages waiting in the queue or delivered and not
acknowledged yet, counted from Redis, for the per-tenant cap and `actonce status`.

It reads the attempts queue and kombu's unacked hash whole and names each message's tenant from
its arguments (ids only, `worker.intake.check.arguments_of`): no bookkeeping of its own, so it
is right for every dispatcher at once and after any restart. The fair dispatcher keeps the queue
short; the unacked hash holds a message per busy worker child and each retry waiting for its time.
"""

import json
from collections import Counter
from typing import Final

import redis

from actonce.worker.intake.check import arguments_of
from actonce.worker.settings import ATTEMPTS_QUEUE, UNACKED_KEY

MOST_READ: Final = 10_000
"""The most messages read from the queue, and from the unacked hash, in one count."""


def in_flight_by_tenant(client: "redis.Redis", *, max_bytes: int) -> Counter[str]:
    """Return how many attempt messages of each tenant wait in the attempts queue or are
    delivered and unacknowledged; turn messages and unreadable ones are left out.

    Args:
        client: The broker's Redis.
        max_bytes: The largest message read (`ACTONCE_MAX_MESSAGE_BYTES`).
    """
    pipe = client.pipeline(transaction=False)
    pipe.lrange(ATTEMPTS_QUEUE, 0, MOST_READ - 1)
    pipe.hvals(UNACKED_KEY)
    waiting, delivered = pipe.execute()
    counts: Counter[str] = Counter()
    for item in waiting:
        _count(counts, item, max_bytes)
    for value in delivered[:MOST_READ]:
        # kombu keeps `[envelope, exchange, routing key]` for each delivered message.
        try:
            envelope = json.loads(value)[0]
        except (ValueError, TypeError, IndexError, KeyError):
            continue
        _count(counts, json.dumps(envelope).encode(), max_bytes)
    return counts


def _count(counts: Counter[str], item: object, max_bytes: int) -> None:
    if not isinstance(item, bytes):
        return
    kwargs = arguments_of(item, max_bytes) or {}
    tenant = kwargs.get("tenant_id")
    if isinstance(tenant, str) and "run_id" in kwargs:  # an attempt's, not a turn's
        counts[tenant] += 1
