"""What the contenders are given: bursts of runs, and events one at a time, and how they end.

A burst publishes `runs` `bench.requested` events at once, each asking for a notice and one keyed
edit (2 writes): in the `own` workload, into one workspace, each run edits a ledger of its own, so
no two runs conflict; in the `shared` workload all edit one ledger and meet version conflicts; in
the `spread` workload each run edits a ledger of its own, and the runs are spread over
`SPREAD_WORKSPACES` workspaces, as a deployment's tenants and projects spread them: reflexr and
artifactr order each workspace's log under a lock on its row, so the runs of one workspace commit
one transaction at a time, whoever runs them. The clock runs from the first publish to the last
run's `updated_at`.

At low load, events are published one at a time, `gap_s` apart, and each run's latency is its
event's append time (`Envelope.ts`) to its `updated_at` (succeeded).
"""

import asyncio
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal

import reflexr.sql
import sqlalchemy as sa
from reflexr.core import Run, SourceActor
from reflexr.sql.tables import RunRow
from reflexr.workspace import WorkspaceRef

from actonce.worker.process.runtime import Runtime
from bench.definition import LEDGER_ID, BenchRequested, own_ledger, prepare
from lab.settle import TERMINAL

TENANT: Final = "bench"
WORKSPACE: Final = "bench"
FEED: Final = SourceActor(name="bench-feed")
WRITES: Final = 2
"""Writes per run: one notice and one keyed edit."""

SPREAD_WORKSPACES: Final = 10
"""How many workspaces the `spread` workload's runs are spread over."""

type Workload = Literal["own", "shared", "spread"]

type RunKey = tuple[str, int]
"""A run of the bench, by the workspace and `seq` of the event that fired it."""


def workspace_of(key: str, workload: Workload) -> str:
    """The workspace the run of `key` is published in."""
    if workload != "spread":
        return WORKSPACE
    return f"{WORKSPACE}-{zlib.crc32(key.encode()) % SPREAD_WORKSPACES}"


def workspaces(workload: Workload) -> list[str]:
    """Every workspace `workload` publishes in."""
    if workload != "spread":
        return [WORKSPACE]
    return [f"{WORKSPACE}-{i}" for i in range(SPREAD_WORKSPACES)]


def _by_workspace(run_keys: list[str], workload: Workload) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for key in run_keys:
        grouped.setdefault(workspace_of(key, workload), []).append(key)
    return grouped


@dataclass(frozen=True)
class Fired:
    """A run of the bench and the workspace it is in."""

    workspace_id: str
    run: Run

    @property
    def key(self) -> RunKey | None:
        """The workspace and `seq` of the event that fired it."""
        return (self.workspace_id, self.run.matched[0]) if self.run.matched else None


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


async def prepare_workspace(runtime: Runtime, all_keys: list[str], workload: Workload) -> None:
    """Create, in each workspace of `workload`, the thread, the shared ledger and a ledger of
    its own for each key published there."""
    grouped = _by_workspace(all_keys, workload)
    for workspace in workspaces(workload):
        await prepare(runtime.artifactr, TENANT, workspace, own_ledgers=grouped.get(workspace, []))


def _event(key: str, workload: Workload) -> BenchRequested:
    ledger = LEDGER_ID if workload == "shared" else own_ledger(key)
    return BenchRequested(key=key, writes=WRITES, ledger=ledger)


async def publish_burst(runtime: Runtime, run_keys: list[str], workload: Workload) -> datetime:
    """Publish one event per key at once (in chunks of 250, a transaction each); return when
    the first chunk was committed: before that no contender can see any of them, and building
    a chunk costs the bench about half a second."""
    started: datetime | None = None
    for workspace, keys_there in _by_workspace(run_keys, workload).items():
        opened = await runtime.reflexr.open(TENANT, workspace, actor=FEED)
        for first in range(0, len(keys_there), 250):
            chunk = [_event(key, workload) for key in keys_there[first : first + 250]]
            await opened.publish_many(chunk, ids=[f"evt_{e.key}" for e in chunk])
            started = started or datetime.now(UTC)
    return started or datetime.now(UTC)


async def runs_of(runtime: Runtime, workload: Workload) -> list[Fired]:
    """Every run of the workload's workspaces."""
    found: list[Fired] = []
    for workspace in workspaces(workload):
        runs = await reflexr.sql.SqlStorage.runs(
            runtime.reflexr.storage,  # type: ignore[arg-type]
            WorkspaceRef(TENANT, workspace),
        )
        found += [Fired(workspace, run) for run in runs]
    return found


async def settled(
    runtime: Runtime, workload: Workload, count: int, timeout_s: float, *, every_s: float = 2.0
) -> list[Fired]:
    """Wait until the workload's workspaces hold `count` runs, all terminal, and return them.

    Each wait counts the runs by status in one statement, every `every_s`; the runs are read
    once, when they are all there. Reading every run at each wait cost the bench process 40 to
    100 ms of CPU a time during a burst, on the cores the contender is measured on.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = await _statuses(runtime, workload)
        if sum(statuses.values()) >= count and all(s in TERMINAL for s in statuses):
            found = await runs_of(runtime, workload)
            if len(found) >= count and all(f.run.status in TERMINAL for f in found):
                return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{dict(statuses)} of {count} after {timeout_s}s")
        await asyncio.sleep(every_s)


async def caught_up(
    runtime: Runtime, workload: Workload, within: int, timeout_s: float, *, every_s: float = 0.25
) -> float:
    """Wait until every rule's cursor in the workload's workspaces is within `within` entries of
    the head each log had when called; return the seconds waited.

    A burst leaves its contender rules to evaluate after its last run settled: the reactor's
    next poll reads the last runs' facts, and the pool's dispatcher reads the rules that heard
    nothing in the burst once the log stands still (its catch-up, which it leaves alone below
    `dispatcher.CATCH_UP_ENTRIES`). That is the burst's work, counted in its CPU, not the next
    window's.

    Raises:
        TimeoutError: If the rules are still behind after `timeout_s`.
    """
    began = time.monotonic()
    # reflexr's own reads: the runtime's storage is the dispatcher's kind, bounded in places.
    storage: Any = runtime.reflexr.storage
    sql = reflexr.sql.SqlStorage
    refs = [WorkspaceRef(TENANT, workspace) for workspace in workspaces(workload)]
    heads = {ref: await sql.head_seq(storage, ref) for ref in refs}
    while True:
        behind: dict[str, int] = {}
        for ref, head in heads.items():
            progress = await sql.progress(storage, ref)
            lag = head - min((known.cursor for known in progress.values()), default=0)
            if lag >= within:
                behind[ref.workspace_id] = lag
        if not behind:
            return time.monotonic() - began
        if time.monotonic() - began > timeout_s:
            raise TimeoutError(f"rules still behind after {timeout_s}s: {behind}")
        await asyncio.sleep(every_s)


async def _statuses(runtime: Runtime, workload: Workload) -> Counter[str]:
    """How many runs of the workload's workspaces are in each status: one statement."""
    query = (
        sa.select(RunRow.status, sa.func.count())
        .where(RunRow.tenant_id == TENANT, RunRow.workspace_id.in_(workspaces(workload)))
        .group_by(RunRow.status)
    )
    async with runtime.engine("reflexr").connect() as connection:
        rows = (await connection.execute(query)).all()
    return Counter({str(status): int(n) for status, n in rows})


def burst_of(found: list[Fired], seqs: set[RunKey], started: datetime) -> Burst:
    """The burst made of the runs fired by the events at `seqs`."""
    mine = [f.run for f in found if f.key in seqs]
    end = max(r.updated_at for r in mine)
    return Burst(
        runs=len(mine),
        seconds=(end - started).total_seconds(),
        failed=sum(1 for r in mine if r.status != "succeeded"),
        latencies_ms=[(r.updated_at - r.created_at).total_seconds() * 1000 for r in mine],
    )


async def seqs_of(
    runtime: Runtime, workload: Workload, event_ids: set[str]
) -> dict[RunKey, datetime]:
    """The workspace, seq and append time of each event of `event_ids` in the workload's logs."""
    found: dict[RunKey, datetime] = {}
    for workspace in workspaces(workload):
        opened = await runtime.reflexr.open(TENANT, workspace, actor=FEED)
        for envelope in await opened.read(types=[BenchRequested.event_type]):
            if envelope.id in event_ids:
                found[(workspace, envelope.seq)] = envelope.ts
    return found


async def trickle(
    runtime: Runtime, run_keys: list[str], gap_s: float, workload: Workload = "own"
) -> None:
    """Publish one event per key, `gap_s` apart (a conflict-free workload)."""
    opened = {
        workspace: await runtime.reflexr.open(TENANT, workspace, actor=FEED)
        for workspace in workspaces(workload)
    }
    next_at = time.monotonic()
    for key in run_keys:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        next_at += gap_s
        await opened[workspace_of(key, workload)].publish(_event(key, workload), id=f"evt_{key}")


@dataclass(frozen=True)
class EventLatency:
    """One low-load event: its workspace, and append → fired and append → succeeded in ms
    (None where its run did not fire, or did not succeed)."""

    workspace_id: str
    fired_ms: float | None
    succeeded_ms: float | None

    def row(self) -> dict[str, object]:
        """As `var/bench.json` keeps it, to a tenth of a millisecond."""
        return {
            "workspace": self.workspace_id,
            "fired_ms": None if self.fired_ms is None else round(self.fired_ms, 1),
            "succeeded_ms": None if self.succeeded_ms is None else round(self.succeeded_ms, 1),
        }


def each_event(found: list[Fired], appended: dict[RunKey, datetime]) -> list[EventLatency]:
    """Each of `appended`'s events in publish order, with its run's latencies.

    Percentiles say how many events were slow; kept whole, this says which (the first after a
    burst, or the first in a workspace), so a p95 can be explained from `var/bench.json`."""
    runs = {f.key: f.run for f in found if f.key in appended}
    events: list[EventLatency] = []
    for key, at in sorted(appended.items(), key=lambda item: item[1]):
        run = runs.get(key)
        events.append(
            EventLatency(
                workspace_id=key[0],
                fired_ms=(run.created_at - at).total_seconds() * 1000 if run else None,
                succeeded_ms=(run.updated_at - at).total_seconds() * 1000
                if run and run.status == "succeeded"
                else None,
            )
        )
    return events


def percentile(values: list[float], q: float) -> float | None:
    """The `q` quantile of `values` (nearest rank), None if there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
