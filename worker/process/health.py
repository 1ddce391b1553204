"""What a process says about its health: one ready line, one line per back-off step, a heartbeat.

A process logs `ready_line` once its broker and stores answered, never before. While they do not
answer, the dispatcher backs off (`backoff_s`: 1 s, 2 s, 4 s … up to 30 s) and logs one line per
step, the traceback only at DEBUG, until `ACTONCE_DISPATCHER_MAX_FAILED_POLLS` in a row failed
and it exits 1. It writes a heartbeat to Redis after its polls (`beat`), under
`actonce:heartbeat:dispatcher:<host>:<pid>`, which `actonce status` reads.
"""

import json
import logging
import os
import socket
import time
from collections.abc import Sequence
from typing import Final

import redis

from actonce.worker.process.interpreter import loop_name
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


def ready_line(
    settings: Settings, *, role: str, queues: Sequence[str], concurrency: int | None = None
) -> str:
    """Return the one line a process logs once its broker and stores answer, passwords masked."""
    stores = " ".join(f"{store}={mask_url(settings.store_url(store))}" for store in STORES)
    processes = f" concurrency={concurrency}" if concurrency is not None else ""
    return (
        f"{role} ready: queues={','.join(queues)}{processes} loop={loop_name(settings.event_loop)} "
        f"broker={mask_url(settings.broker_url)} {stores}"
    )


def backoff_s(failures: int) -> float:
    """Return how long to wait after `failures` failed tries in a row: 1 s, doubling up to
    `MAX_BACKOFF_S`."""
    return min(MAX_BACKOFF_S, 2.0 ** max(0, failures - 1))


def reason(error: BaseException) -> str:
    """Return an error's type and first line: what one back-off line says of it."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


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
