"""`actonce status`: is the pool alive, in a few lines and an exit code (compose's health check).

It asks the broker's Redis and the actonce store what an operator would ask: does the broker
answer, which workers answer a ping (`celery inspect ping`), when each dispatcher last polled
(its heartbeat, `worker.process.health`), how many messages wait in each queue and how many are
delivered but unacked, and how many dead letters wait for an operator. It is healthy when the
parts it is asked to require answer: the workers (or one node of them) and a dispatcher that
polled within `DISPATCHER_STALE_S`.
"""

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import redis

from actonce.worker.dead_letters.store import SqlDeadLetters
from actonce.worker.dispatching.held_report import held_by_tenant
from actonce.worker.dispatching.in_flight import in_flight_by_tenant
from actonce.worker.process.broker_access import broker_client
from actonce.worker.process.health import last_beats, reason
from actonce.worker.process.runtime import make_engine
from actonce.worker.process.sentinels import master_address
from actonce.worker.settings import QUEUES, UNACKED_KEY, Settings, mask_url
from actonce.worker.storage.unreachable import describe

TENANTS_SHOWN: Final = 5
"""How many tenants `actonce status` shows runs due and in flight for: the busiest."""

DISPATCHER_STALE_S: Final = 60.0
"""A dispatcher whose last poll is older than this counts as not polling."""


PARTS: Final = ("worker", "dispatcher")
"""What `--require` can name."""


@dataclass
class Status:
    """What `gather` found; `lines` says it, `problems` for the parts required."""

    broker: str
    broker_answers: bool
    broker_problem: str | None = None
    """Why the broker did not answer: the error's type and first line."""
    master: str | None = None
    """`HOST:PORT` of the master the sentinels name, on a `sentinel://` broker."""
    workers: list[str] = field(default_factory=list)
    dispatchers: dict[str, float] = field(default_factory=dict)
    """Each dispatcher's `host:pid` and the seconds since its last poll."""
    queued: dict[str, int] = field(default_factory=dict)
    unacked: int = 0
    tenants: dict[str, tuple[int, int]] = field(default_factory=dict)
    """The `TENANTS_SHOWN` tenants with the most runs due and held by fair dispatchers, or in
    flight: (held, in flight) of each."""
    dead_letters: int | None = None
    dead_letters_problem: str | None = None

    def problems(self, required: Sequence[str]) -> list[str]:
        """Return why the pool is not healthy for the parts `required`; empty when it is."""
        if not self.broker_answers:
            return [f"the broker at {self.broker} does not answer{self._why()}"]
        found = []
        if "worker" in required and not self.workers:
            found.append("no worker answers a ping")
        if "dispatcher" in required and not any(
            age <= DISPATCHER_STALE_S for age in self.dispatchers.values()
        ):
            found.append(f"no dispatcher polled in the last {DISPATCHER_STALE_S:.0f}s")
        return found

    def lines(self, required: Sequence[str]) -> list[str]:
        """Return the report, one fact a line, the verdict last."""
        if not self.broker_answers:
            return [f"broker: {self.broker} does not answer{self._why()}", "status: unhealthy"]
        out = [f"broker: {self.broker} answers"]
        if self.master is not None:
            out.append(f"master: {self.master} (named by the sentinels)")
        names = f" ({', '.join(self.workers)})" if self.workers else ""
        out.append(f"workers: {len(self.workers)} answering{names}")
        if self.dispatchers:
            for name, age in sorted(self.dispatchers.items(), key=lambda item: item[1]):
                out.append(f"dispatcher {name}: last poll {age:.1f}s ago")
        else:
            out.append("dispatcher: no heartbeat")
        queues = ", ".join(f"{name} {depth} waiting" for name, depth in self.queued.items())
        out.append(f"queues: {queues}; unacked: {self.unacked}")
        out.extend(self._tenant_lines())
        if self.dead_letters is None:
            out.append(f"dead letters: unknown ({self.dead_letters_problem})")
        else:
            out.append(f"dead letters: {self.dead_letters} (actonce dead list)")
        problems = self.problems(required)
        out.append(f"status: unhealthy: {'; '.join(problems)}" if problems else "status: ok")
        return out

    def _tenant_lines(self) -> list[str]:
        """One line per busiest tenant: its runs due and held for its turn, and in flight."""
        return [
            f"tenant {tenant}: {held} due and held, {flying} in flight"
            for tenant, (held, flying) in self.tenants.items()
        ]

    def _why(self) -> str:
        return f" ({self.broker_problem})" if self.broker_problem else ""


def gather(settings: Settings, *, timeout_s: float = 1.0, node: str | None = None) -> Status:
    """Ask the broker, the workers (or only `node`) and the actonce store how the pool is."""
    status = Status(broker=mask_url(settings.broker_url), broker_answers=False)
    client = broker_client(settings, socket_connect_timeout=2.0, socket_timeout=5.0)
    try:
        try:
            client.ping()
            status.master = master_address(client)
        except (redis.RedisError, OSError) as silent:
            status.broker_problem = reason(silent)
            return status
        status.broker_answers = True
        status.workers = _ping_workers(settings, timeout_s=timeout_s, node=node)
        now = time.time()
        status.dispatchers = {name: now - at for name, at in last_beats(client).items()}
        status.queued = {queue: int(client.llen(queue)) for queue in QUEUES}
        status.unacked = int(client.hlen(UNACKED_KEY))
        status.tenants = _busiest_tenants(client, settings)
    finally:
        client.close()
    try:
        status.dead_letters = asyncio.run(_count_dead_letters(settings))
    except Exception as failed:
        status.dead_letters_problem = describe("actonce", settings.store_url("actonce"), failed)
    return status


# ─── how ──────────────────────────────────────────────────────────────────────


def _ping_workers(settings: Settings, *, timeout_s: float, node: str | None) -> list[str]:
    from actonce.worker.app import make_celery

    celery = make_celery(settings)
    try:
        replies = celery.control.ping(timeout=timeout_s, destination=[node] if node else None)
    except Exception as failed:  # kombu raises what its transport raises
        raise RuntimeError(f"could not ping the workers: {reason(failed)}") from failed
    finally:
        celery.close()
    return sorted(name for reply in replies or [] for name in reply)


def _busiest_tenants(client: redis.Redis, settings: Settings) -> dict[str, tuple[int, int]]:
    """The `TENANTS_SHOWN` tenants with the most runs held or in flight, busiest first."""
    held = held_by_tenant(client)
    flying = in_flight_by_tenant(client, max_bytes=settings.max_message_bytes)
    busiest = (held + flying).most_common(TENANTS_SHOWN)
    return {tenant: (held[tenant], flying[tenant]) for tenant, _ in busiest}


async def _count_dead_letters(settings: Settings) -> int:
    engine = make_engine(settings.store_url("actonce"))
    try:
        return await SqlDeadLetters(engine).count()
    finally:
        await engine.dispose()
