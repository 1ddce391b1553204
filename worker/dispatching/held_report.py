"""What each fair dispatcher holds, by tenant, told through Redis for `actonce status`.

A serving dispatcher writes, with its heartbeat, how many due runs it holds for each tenant
(the `TOLD_TENANTS` with the most), under `actonce:fair:<host>:<pid>`, expiring after
`TOLD_TTL_S`: a dispatcher that stopped stops counting. Tenant ids only, never a run.
"""

import json
import os
import socket
import time
from collections import Counter
from collections.abc import Mapping
from typing import Final

import redis

from actonce.worker.settings import KEY_PREFIX

HELD_PREFIX: Final = f"{KEY_PREFIX}fair:"
"""Where dispatchers tell what they hold, one key per process."""

TOLD_TTL_S: Final = 60
"""How long a dispatcher's last report counts."""

TOLD_TENANTS: Final = 20
"""How many tenants a report names: those with the most runs held."""


def tell_held(client: "redis.Redis", held: Mapping[str, int]) -> None:
    """Write this dispatcher's runs held, by tenant (the `TOLD_TENANTS` with the most)."""
    top = dict(Counter(held).most_common(TOLD_TENANTS))
    value = json.dumps({"at": time.time(), "held": top})
    client.set(f"{HELD_PREFIX}{socket.gethostname()}:{os.getpid()}", value, ex=TOLD_TTL_S)


def held_by_tenant(client: "redis.Redis") -> Counter[str]:
    """Return the runs every live fair dispatcher holds, by tenant, summed."""
    total: Counter[str] = Counter()
    for key in client.scan_iter(match=f"{HELD_PREFIX}*", count=100):
        value = client.get(key)
        if value is None:
            continue
        try:
            told = json.loads(value)["held"]
            total.update({str(tenant): int(count) for tenant, count in told.items()})
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return total
