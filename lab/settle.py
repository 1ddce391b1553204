"""Waiting until runs have settled: the one loop the demo, the tests and the benches share.

A run has settled when its status will not change again unless an operator replays it. What to
read is the caller's (one workspace's runs, or several workspaces' read straight from storage),
so the loop is written once.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from reflexr.core import Run

TERMINAL: Final = frozenset({"succeeded", "dead", "cancelled", "skipped"})
"""The statuses of a run that will not change again unless an operator replays it."""


def all_settled(found: Sequence[Run], runs: int = 1) -> bool:
    """Whether `found` holds at least `runs` runs and every one of them has settled."""
    return len(found) >= runs and all(run.status in TERMINAL for run in found)


async def wait_settled(
    read: Callable[[], Awaitable[Sequence[Run]]],
    *,
    runs: int = 1,
    timeout_s: float = 60.0,
    poll_s: float = 0.2,
    progress: Callable[[Sequence[Run]], None] | None = None,
) -> list[Run]:
    """Call `read` until it returns at least `runs` runs, all settled; return the last read.

    It reads at least once, then every `poll_s`. After `timeout_s` it returns the runs as they
    are, so the caller's assertion (or `all_settled`) says what was still going on.

    Args:
        read: Returns the runs to watch, such as an opened reflexr workspace's `runs`.
        runs: How many runs must exist before they can count as settled.
        timeout_s: How long to keep reading.
        poll_s: How long to wait between reads; reading is not free, so a bench that times the
            pool reads seldom.
        progress: Called with each read's runs, for a caller that shows how far it got.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        found = list(await read())
        if progress is not None:
            progress(found)
        if all_settled(found, runs) or time.monotonic() >= deadline:
            return found
        await asyncio.sleep(poll_s)
