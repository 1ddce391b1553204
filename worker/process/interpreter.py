"""How a long-lived actonce process runs Python: uvloop's event loop, and a collector told
that the heap built at start stays.

A worker child or a dispatcher spends most of its CPU in SQLAlchemy and asyncpg, one attempt
after another, for hours. Two things cost it CPU that buys nothing:

- asyncio's own loop, where uvloop (asyncpg's authors' loop, in C) runs the same callbacks and
  sockets for less; asyncpg and aiosqlite run on either;
- the cyclic collector walking, in each of its full collections, the many objects built at
  start (the definition, SQLAlchemy's mappers and compiled statements, Celery's app) that never
  die. `gc.freeze` moves them out of its reach; a larger first threshold lets the
  short-lived objects of one statement die by reference count before a collection visits them.

Neither changes what a process does, only what it costs: an attempt, a commit and a retry are
the same on either loop. `ACTONCE_EVENT_LOOP=asyncio` rules uvloop out; where it is not installed
(it has no Windows build), asyncio's loop is used.
"""

import asyncio
import gc
import importlib.util
import logging
from typing import Final, Literal

log = logging.getLogger("actonce.interpreter")

HAS_UVLOOP: Final = importlib.util.find_spec("uvloop") is not None
"""Whether uvloop is installed: a dependency wherever it builds."""

YOUNG_THRESHOLD: Final = 10_000
"""Allocations between two collections of the youngest generation (Python's default: 700)."""


type LoopChoice = Literal["uvloop", "asyncio"]


def loop_name(choice: LoopChoice) -> LoopChoice:
    """Which loop `new_event_loop(choice)` makes: `uvloop` only if asked for and installed."""
    return "uvloop" if choice == "uvloop" and HAS_UVLOOP else "asyncio"


def new_event_loop(choice: LoopChoice) -> asyncio.AbstractEventLoop:
    """Return a new event loop of `loop_name(choice)`'s kind (`ACTONCE_EVENT_LOOP`).

    For `asyncio.Runner(loop_factory=...)` and loops run in a thread of their own; the loop is
    not installed as any thread's current loop.
    """
    if loop_name(choice) == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def keep_startup_heap() -> None:
    """Tell the cyclic collector that what this process built so far stays, and collect less
    often from now on.

    Call it once a process has built what it keeps for its life (a worker child's runtime, a
    dispatcher's), not in a process that builds and drops runtimes (a test, a one-shot command):
    what is frozen is never collected. Cyclic garbage made later is still collected.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    log.info(
        "collector: %d objects built at start kept out of its reach; young generation every %d",
        gc.get_freeze_count(),
        YOUNG_THRESHOLD,
    )
