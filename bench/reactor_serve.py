"""relayr-ai's reactor, run as reflexr's docs run it: `python -m bench.reactor_serve`.

One process holds one `reflexr.workspace.Reactor` (reflexr's default concurrency, 10, and poll
interval, 1 s, unless `BENCH_REACTOR_POLL_S` says otherwise) over SQL stores on
`ACTONCE_DATABASE_URL`, with relayr's own `relayr.outbound.Outbound` and the bench's rules, and
calls `reactor.serve(stop=stop)` until SIGTERM. Several such processes on one database are
relayr's way to scale: reflexr leases evaluation per workspace and each run's attempt. The
engine is SQLAlchemy's plain `create_async_engine(url)`, as an application would make it.
"""

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import artifactr
import artifactr.sql
import reflexr.sql
import reflexr.workspace as rw
import relayr.sql
from reflexr.workspace import Reactor
from relayr.events import BRIDGED
from relayr.inbound.followers import SOURCE
from relayr.outbound import Allowlist as RelayrAllowlist
from relayr.outbound import Outbound as RelayrOutbound
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from actonce.worker.settings import Settings
from bench.definition import ACTIONS, DIRECT, app

READY = "reactor serving"
"""What the process prints once its reactor serves."""


@dataclass(frozen=True)
class Deps:
    """What the bench's actions reach: `deps.outbound.acting(reaction)`."""

    outbound: RelayrOutbound


def relayr_reactor(engine: AsyncEngine, *, concurrency: int = 10) -> Reactor[Any]:
    """relayr-ai 0.1.1's reactor over one engine's stores, with relayr's Outbound."""
    workspaces = rw.Workspaces(
        reflexr.sql.SqlStorage(engine),
        events=[*BRIDGED, *app.events],
        publishers={"artifactr": [SOURCE]},
        rules=app.rules,
    )
    artifacts = artifactr.Workspaces(
        artifactr.sql.SqlStorage(engine), types=list(app.artifact_types)
    )
    outbound = RelayrOutbound(
        artifacts,
        relayr.sql.SqlLedger(engine),
        allowlists={
            "bench:*": RelayrAllowlist(direct=DIRECT, threads="any"),
            "chaos:*": RelayrAllowlist(direct=DIRECT, threads="any"),
        },
    )
    actions = dict(ACTIONS)
    return Reactor(workspaces, actions=actions, deps=Deps(outbound), concurrency=concurrency)


@contextlib.asynccontextmanager
async def engine_until_signalled() -> AsyncIterator[tuple[AsyncEngine, asyncio.Event]]:
    """Yield the reflexr store's engine (from the `ACTONCE_*` variables) and an event SIGTERM or
    SIGINT sets; dispose of the engine on leaving. For a bench process that runs a reactor."""
    engine = create_async_engine(Settings.from_env().store_url("reflexr"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        yield engine, stop
    finally:
        await engine.dispose()


async def serve() -> None:
    """Serve until SIGTERM or SIGINT."""
    async with engine_until_signalled() as (engine, stop):
        reactor = relayr_reactor(engine)
        print(READY, flush=True)
        poll_s = float(os.environ.get("BENCH_REACTOR_POLL_S") or 1.0)
        await reactor.serve(poll_interval=timedelta(seconds=poll_s), stop=stop)


if __name__ == "__main__":
    asyncio.run(serve())
    sys.exit(0)
