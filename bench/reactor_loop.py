"""relayr-ai's reactor in the tightest loop its public API allows: `python -m bench.reactor_loop`.

What a user who wants throughput from relayr in process writes instead of `reactor.serve`: one
`reflexr.workspace.Reactor` with `concurrency=10`, built as `bench.reactor_serve` builds it (same
stores, same engine, relayr's own `Outbound`), looping `await reactor.evaluate()` then
`await reactor.execute(limit=100)`, and sleeping `BENCH_LOOP_IDLE_S` (default `IDLE_S`) only
after a pass that fired nothing and finished no attempt. `serve` waits its poll interval after
every pass, busy or not; this loop starts the next pass at once while there is work.

It calls neither `tick()` (the bench's rules have no schedules) nor anything private. A pass that
raises is logged and followed by the idle sleep, as `serve` logs a failed pass and polls again.
SIGTERM or SIGINT stops it after the pass in hand. Several such processes on one database share
the work through reflexr's leases, as several `serve`s do.
"""

import asyncio
import logging
import os
import sys
from typing import Any, Final

from reflexr.workspace import Reactor

from bench.reactor_serve import engine_until_signalled, relayr_reactor

READY: Final = "reactor looping"
"""What the process prints once its loop runs."""

IDLE_S: Final = 0.1
"""How long the loop sleeps after a pass that did nothing: the faster `serve` poll the bench
runs, so that, at low load, the loop and `serve` at 0.1 s wait alike and differ only in the
wait `serve` adds after a busy pass."""

CONCURRENCY: Final = 10
"""Attempts in flight at once: reflexr's default, as `serve` runs it."""

EXECUTE_LIMIT: Final = 100
"""Runs one `execute` takes: the limit `serve` passes too."""

logger = logging.getLogger("bench.reactor_loop")


async def loop_until(reactor: Reactor[Any], stop: asyncio.Event, idle_s: float) -> int:
    """Evaluate then execute until `stop` is set, sleeping `idle_s` (or until stopped) only after
    a pass that fired nothing and finished no attempt; return the attempts finished.

    A pass in which another process held every lease this one wanted counts as one that did
    nothing: the other is doing the work.
    """
    finished = 0
    while not stop.is_set():
        try:
            fired = await reactor.evaluate()
            done = await reactor.execute(limit=EXECUTE_LIMIT)
        except Exception:
            logger.exception("a loop pass failed; the next one will try again")
            fired = done = 0
        finished += done
        if fired or done:
            continue
        try:
            async with asyncio.timeout(idle_s):
                await stop.wait()
        except TimeoutError:
            pass
    return finished


async def serve() -> None:
    """Loop until SIGTERM or SIGINT."""
    async with engine_until_signalled() as (engine, stop):
        reactor = relayr_reactor(engine, concurrency=CONCURRENCY)
        print(READY, flush=True)
        idle_s = float(os.environ.get("BENCH_LOOP_IDLE_S") or IDLE_S)
        await loop_until(reactor, stop, idle_s)


if __name__ == "__main__":
    asyncio.run(serve())
    sys.exit(0)
