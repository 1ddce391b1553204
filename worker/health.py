"""What a process says about its health: one ready line, one line per back-off step, a heartbeat.

A process logs `ready_line` once its broker and stores answered, never before. While its broker
does not answer it backs off (`backoff_steps`: 1 s, 2 s, 4 s … up to 30 s) and logs one line per
step, the traceback only at DEBUG; after `ACTONCE_GIVE_UP_S` it gives up (`GaveUp`) and exits
non-zero. The dispatcher writes a heartbeat to Redis after its polls (`beat`), under
`actonce:heartbeat:dispatcher:<host>:<pid>`, which `actonce status` reads.
"""

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Final

import redis

from actonce.worker.settings import KEY_PREFIX, STORES, Settings, mask_url

HEARTBEAT_PREFIX: Final = f"{KEY_PREFIX}heartbeat:dispatcher:"
"""Where dispatchers' heartbeats live, one key per process, each expiring on its own."""

HEARTBEAT_TTL_S: Final = 300
"""How long a heartbeat outlives its dispatcher: `actonce status` reports a stale one as such."""

HEARTBEAT_EVERY_S: Final = 1.0
"""How often a serving dispatcher writes its heartbeat at most."""

MAX_BACKOFF_S: Final = 30.0
"""The longest wait between two tries of a lost broker or store."""

log = logging.getLogger("actonce.health")


class GaveUp(RuntimeError):
    """Raised when a process stopped retrying its broker or stores; it exits non-zero."""


def ready_line(
    settings: Settings, *, role: str, queues: Sequence[str], concurrency: int | None = None
) -> str:
    """Return the one line a process logs once its broker and stores answer, passwords masked."""
    stores = " ".join(f"{store}={mask_url(settings.store_url(store))}" for store in STORES)
    processes = f" concurrency={concurrency}" if concurrency is not None else ""
    return (
        f"{role} ready: queues={','.join(queues)}{processes} "
        f"broker={mask_url(settings.broker_url)} {stores}"
    )


def backoff_steps(give_up_s: float) -> Iterator[float]:
    """Yield the waits between tries: 1 s, doubling up to `MAX_BACKOFF_S`, until `give_up_s`
    of waiting has passed."""
    waited, step = 0.0, 1.0
    while waited < give_up_s:
        wait = min(step, give_up_s - waited)
        yield wait
        waited += wait
        step = min(step * 2, MAX_BACKOFF_S)


def reason(error: BaseException) -> str:
    """Return an error's type and first line: what one back-off line says of it."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def wait_for_broker(settings: Settings, *, sleep: Callable[[float], None] = time.sleep) -> None:
    """Return once the broker answers PING; log one line per back-off step until it does.

    Raises:
        GaveUp: If it has not answered after `ACTONCE_GIVE_UP_S`.
    """
    where = mask_url(settings.broker_url)
    steps = backoff_steps(settings.give_up_s)
    while True:
        try:
            _ping(settings.broker_url)
            return
        except (redis.RedisError, OSError) as lost:
            wait = next(steps, None)
            if wait is None:
                raise GaveUp(
                    f"the broker at {where} did not answer for {settings.give_up_s:.0f}s "
                    f"({reason(lost)}); giving up"
                ) from lost
            log.warning(
                "the broker at %s does not answer (%s); retrying in %.0fs",
                where,
                reason(lost),
                wait,
            )
            log.debug("broker check failed", exc_info=lost)
            sleep(wait)


def heartbeat_key() -> str:
    """Return this process's heartbeat key."""
    return f"{HEARTBEAT_PREFIX}{socket.gethostname()}:{os.getpid()}"


def beat(client: "redis.Redis", *, polls: int) -> None:
    """Write this dispatcher's heartbeat: when it last polled, and how many polls it made."""
    value = json.dumps({"at": time.time(), "polls": polls})
    client.set(heartbeat_key(), value, ex=HEARTBEAT_TTL_S)


def last_beats(client: "redis.Redis") -> dict[str, float]:
    """Return each dispatcher's last poll time (epoch seconds), by its `host:pid`."""
    found: dict[str, float] = {}
    for key in client.scan_iter(match=f"{HEARTBEAT_PREFIX}*", count=100):
        value = client.get(key)
        if value is None:
            continue
        name = key.decode() if isinstance(key, bytes) else str(key)
        found[name.removeprefix(HEARTBEAT_PREFIX)] = float(json.loads(value)["at"])
    return found


def _ping(url: str) -> None:
    client = redis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=2.0)
    try:
        client.ping()
    finally:
        client.close()
