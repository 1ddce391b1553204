"""What the contenders are given: bursts of runs, and events one at a time, and how they end.

A burst publishes `runs` `bench.requested` events at once into one workspace, each asking for a
notice and one keyed edit (2 writes): in the `own` workload each run edits a ledger of its own,
so no two runs conflict; in the `shared` workload all edit one ledger and meet version conflicts.
The clock runs from the first publish to the last run's `updated_at`.

At low load, events are published one at a time, `gap_s` apart, and each run's latency is its
event's append time (`Envelope.ts`) to its `updated_at` (succeeded).
"""

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final, Literal

import reflexr.sql
from reflexr.core import Run, SourceActor
from reflexr.workspace import WorkspaceRef

from actonce.worker.runtime import Runtime
from bench.definition import LEDGER_ID, BenchRequested, own_ledger, prepare
from lab.settle import TERMINAL

TENANT: Final = "bench"
WORKSPACE: Final = "bench"
FEED: Final = SourceActor(name="bench-feed")
WRITES: Final = 2
"""Writes per run: one notice and one keyed edit."""

type Workload = Literal["own", "shared"]


@dataclass
class Burst:
    """How a burst of runs went."""

    runs: int
    seconds: float
    failed: int
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def per_s(self) -> float:
        """Attempts (runs) per second."""
        return self.runs / self.seconds if self.seconds > 0 else 0.0


def keys(prefix: str, count: int) -> list[str]:
    """`count` run keys starting with `prefix`."""
    return [f"{prefix}{i}" for i in range(count)]


async def prepare_workspace(runtime: Runtime, all_keys: list[str]) -> None:
    """Create the thread, the shared ledger and a ledger of its own for each key."""
    await prepare(runtime.artifactr, TENANT, WORKSPACE, own_ledgers=all_keys)


def _event(key: str, workload: Workload) -> BenchRequested:
    ledger = own_ledger(key) if workload == "own" else LEDGER_ID
    return BenchRequested(key=key, writes=WRITES, ledger=ledger)


async def publish_burst(runtime: Runtime, run_keys: list[str], workload: Workload) -> datetime:
    """Publish one event per key at once (in chunks of 250); return when publishing started."""
    started = datetime.now(UTC)
    opened = await runtime.reflexr.open(TENANT, WORKSPACE, actor=FEED)
    for first in range(0, len(run_keys), 250):
        chunk = [_event(key, workload) for key in run_keys[first : first + 250]]
        await opened.publish_many(chunk, ids=[f"evt_{e.key}" for e in chunk])
    return started


async def runs_of(runtime: Runtime) -> list[Run]:
    """Every run of the bench's workspace."""
    return await reflexr.sql.SqlStorage.runs(
        runtime.reflexr.storage,  # type: ignore[arg-type]
        WorkspaceRef(TENANT, WORKSPACE),
    )


async def settled(
    runtime: Runtime, count: int, timeout_s: float, *, every_s: float = 2.0
) -> list[Run]:
    """Wait until the workspace holds `count` runs, all terminal; read them every `every_s`
    (seldom: reading every run costs the database, which the contender's figures include)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await runs_of(runtime)
        if len(found) >= count and all(r.status in TERMINAL for r in found):
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{Counter(r.status for r in found)} of {count} after {timeout_s}s")
        await asyncio.sleep(every_s)


def burst_of(found: list[Run], seqs: set[int], started: datetime) -> Burst:
    """The burst made of the runs fired by the events at `seqs`."""
    mine = [r for r in found if r.matched and r.matched[0] in seqs]
    end = max(r.updated_at for r in mine)
    return Burst(
        runs=len(mine),
        seconds=(end - started).total_seconds(),
        failed=sum(1 for r in mine if r.status != "succeeded"),
        latencies_ms=[(r.updated_at - r.created_at).total_seconds() * 1000 for r in mine],
    )


async def seqs_of(runtime: Runtime, event_ids: set[str]) -> dict[int, datetime]:
    """The seq and append time of each event of `event_ids` in the workspace's log."""
    opened = await runtime.reflexr.open(TENANT, WORKSPACE, actor=FEED)
    found: dict[int, datetime] = {}
    for envelope in await opened.read(types=[BenchRequested.event_type]):
        if envelope.id in event_ids:
            found[envelope.seq] = envelope.ts
    return found


async def trickle(runtime: Runtime, run_keys: list[str], gap_s: float) -> None:
    """Publish one event per key, `gap_s` apart (conflict-free workload)."""
    opened = await runtime.reflexr.open(TENANT, WORKSPACE, actor=FEED)
    next_at = time.monotonic()
    for key in run_keys:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        next_at += gap_s
        await opened.publish(_event(key, "own"), id=f"evt_{key}")


def latencies(found: list[Run], appended: dict[int, datetime]) -> list[float]:
    """Append → succeeded, in ms, of each succeeded run fired by one of `appended`'s events."""
    return [
        (r.updated_at - appended[r.matched[0]]).total_seconds() * 1000
        for r in found
        if r.matched and r.matched[0] in appended and r.status == "succeeded"
    ]


def fired_after(found: list[Run], appended: dict[int, datetime]) -> list[float]:
    """Append → fired (the run created), in ms, of each run fired by one of `appended`'s."""
    return [
        (r.created_at - appended[r.matched[0]]).total_seconds() * 1000
        for r in found
        if r.matched and r.matched[0] in appended
    ]


def percentile(values: list[float], q: float) -> float | None:
    """The `q` quantile of `values` (nearest rank), None if there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
