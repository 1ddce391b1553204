"""Side by side, in one run on the same stores: `python -m bench.bench [--runs N] [--quick]`.

For each backend (fresh SQLite files; a fresh PostgreSQL database `actonce_bench_<hex>`, dropped
after) and one private Redis, the rule `bench:act` (a notice and keyed edits) runs N times:

- **pool c=2 / c=1**: `actonce dispatch` + one `actonce worker` with 2 (then 1) prefork children,
  through `worker.local.LocalPool`; N events are published at once and the clock stops at the last
  run's `updated_at`.
- **in-process**: relayr-ai 0.1.1's way, `reflexr.workspace.Reactor(...).settle()` in this process
  with relayr's own `relayr.outbound.Outbound` (reflexr's default concurrency, 10), same stores.
- **no-op**: a trivial Celery task on the same Redis with actonce's delivery settings, 2 prefork
  children (`bench.noop`): the transport's ceiling.

Latency is each run's `created_at` (fired) → `updated_at` (succeeded), under that saturating load.
SQL statements and transactions per attempt are counted in this process (SQLAlchemy
`before_cursor_execute` and `begin` events), running the exact attempt path of the Celery task
(`tasks.attempt._attempt` over a `Runtime`) and relayr's `Reactor.execute` on the same rule, for
1, 10 and 50 writes per attempt; rule evaluation (firing) is left out of both. A statement is
counted to the store whose table it names; a transaction to the store of its first such statement.

transport_share = (1 / no-op tasks per s) / (1 / pool attempts per s), both with 2 children: the
share of an attempt's wall time the transport alone would take (Celery + Redis).

CPU per attempt, by part, is read from `/proc` for the pool's processes over the timed window:
the prefork children (the attempts themselves), the Celery worker's main process, the private
Redis, and the dispatcher, split by its own thread-CPU figures (the `dispatcher stopped:` line)
into firing (reflexr's `tick` and `evaluate`, which any reactor pays) and sending (looking for
due runs, marking and sending them). machinery_cpu_share = (Celery + Redis + sending) / attempts.
"""

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import redis
import reflexr.sql
import reflexr.workspace as rw
import relayr.sql
from celery import Celery
from reflexr.core import Run, SourceActor
from reflexr.workspace import Reactor, WorkspaceRef
from relayr.events import BRIDGED
from relayr.inbound.followers import SOURCE
from relayr.outbound import Allowlist as RelayrAllowlist
from relayr.outbound import Outbound as RelayrOutbound
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from actonce.worker.local import TERMINAL, LocalPool, cpu_seconds, find_or_start_redis
from actonce.worker.runtime import Runtime, migrate
from actonce.worker.settings import STORES, Settings
from bench import noop
from bench.chaos import pool_env
from bench.definition import DIRECT, BenchRequested, app, prepare
from bench.stores import fresh_stores

TENANT: Final = "bench"
FEED: Final = SourceActor(name="bench-feed")
WRITES: Final = 2
"""Writes per attempt in the throughput runs: one notice and one keyed edit."""

_TABLE = re.compile(r"\b(reflexr|artifactr|relayr|actonce)_\w+")


@dataclass
class Timed:
    """One contender's throughput and latency."""

    name: str
    runs: int
    seconds: float
    latencies_ms: list[float]
    failed: int = 0
    cpu_ms: dict[str, float] = field(default_factory=dict)
    """CPU milliseconds per attempt, by part: where the contender's work went."""

    @property
    def per_s(self) -> float:
        return self.runs / self.seconds if self.seconds > 0 else 0.0

    def pct(self, q: float) -> float | None:
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ─── counting SQL ─────────────────────────────────────────────────────────────


class SqlCount:
    """Statements and transactions by store, from engine events; `reset` between phases."""

    def __init__(self) -> None:
        self.statements: Counter[str] = Counter()
        self.transactions: Counter[str] = Counter()
        self.on = False
        self._attached: set[int] = set()

    def attach(self, engine: AsyncEngine) -> None:
        sync = engine.sync_engine
        if id(sync) in self._attached:
            return
        self._attached.add(id(sync))
        event.listen(sync, "begin", self._begin)
        event.listen(sync, "before_cursor_execute", self._statement)

    def _begin(self, connection: Any) -> None:
        connection.info["bench_pending"] = 0
        connection.info["bench_tx"] = True

    def _statement(self, connection: Any, cursor: Any, statement: str, *_: Any) -> None:
        if not self.on:
            return
        found = _TABLE.search(statement)
        if found is None:
            connection.info["bench_pending"] = connection.info.get("bench_pending", 0) + 1
            return
        store = found.group(1)
        self.statements[store] += 1 + connection.info.get("bench_pending", 0)
        connection.info["bench_pending"] = 0
        if connection.info.pop("bench_tx", False):
            self.transactions[store] += 1

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.statements.clear()
        self.transactions.clear()
        self.on = True
        try:
            yield
        finally:
            self.on = False


# ─── the contenders ───────────────────────────────────────────────────────────


async def publish(runtime: Runtime, workspaces: list[str], runs: int, writes: int) -> datetime:
    """Publish `runs` BenchRequested events at once, dealt out over `workspaces` in turn; return
    when publishing started."""
    started = datetime.now(UTC)
    for at, workspace in enumerate(workspaces):
        opened = await runtime.reflexr.open(TENANT, workspace, actor=FEED)
        keys = [f"{workspace}-{i}" for i in range(at, runs, len(workspaces))]
        for first in range(0, len(keys), 250):
            chunk = [BenchRequested(key=key, writes=writes) for key in keys[first : first + 250]]
            await opened.publish_many(chunk, ids=[f"evt_{e.key}" for e in chunk])
    return started


async def settled_runs(
    runtime: Runtime, workspaces: list[str], runs: int, timeout_s: float, *, every_s: float = 0.1
) -> list[Run]:
    """Wait until `runs` runs of `workspaces` are terminal; read them every `every_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [
            run
            for workspace in workspaces
            for run in await reflexr.sql.SqlStorage.runs(
                runtime.reflexr.storage,  # type: ignore[arg-type]
                WorkspaceRef(TENANT, workspace),
            )
        ]
        if len(found) >= runs and all(r.status in TERMINAL for r in found):
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{workspaces[0]}…: {Counter(r.status for r in found)} after {timeout_s}s of {runs}"
            )
        await asyncio.sleep(every_s)


def spread(name: str, count: int) -> list[str]:
    """`count` workspace names for contender `name`."""
    return [name] if count == 1 else [f"{name}-{k}" for k in range(count)]


def timed(name: str, found: list[Run], started: datetime) -> Timed:
    end = max(r.updated_at for r in found)
    return Timed(
        name=name,
        runs=len(found),
        seconds=(end - started).total_seconds(),
        latencies_ms=[(r.updated_at - r.created_at).total_seconds() * 1000 for r in found],
        failed=sum(1 for r in found if r.status != "succeeded"),
    )


def run_pool(
    runtime: Runtime,
    env: dict[str, str],
    runs: int,
    concurrency: int,
    redis_pid: int | None,
    workspaces: int = 1,
) -> Timed:
    names = spread(f"pool{concurrency}", workspaces)
    for workspace in names:
        runtime.run(prepare(runtime.artifactr, TENANT, workspace))
    with LocalPool(env, workers=1, concurrency=concurrency, loglevel="WARNING") as pool:
        pool.wait_ready(90.0)
        before = {**pool.cpu_seconds(), "redis": _cpu(redis_pid)}
        started = runtime.run(publish(runtime, names, runs, WRITES))
        # Reading every run is costly and the clock stops at the last run's `updated_at`, not
        # when it is seen: look seldom, so the watcher takes no CPU from the pool it times.
        found = runtime.run(settled_runs(runtime, names, runs, 60 + runs * 0.5, every_s=2.0))
        after = {**pool.cpu_seconds(), "redis": _cpu(redis_pid)}
    result = timed(f"pool c={concurrency}", found, started)
    used = {part: (after[part] - before[part]) * 1000 / max(len(found), 1) for part in after}
    firing_share = _firing_share(pool.log("dispatcher"))
    result.cpu_ms = {
        "attempts": used["children"],
        "celery": used["worker"],
        "dispatcher_sending": used["dispatcher"] * (1 - firing_share),
        "dispatcher_firing": used["dispatcher"] * firing_share,
        "redis": used["redis"],
    }
    return result


def _cpu(pid: int | None) -> float:
    return 0.0 if pid is None else cpu_seconds(pid)


def _firing_share(dispatcher_log: str) -> float:
    """The share of the dispatcher's CPU that reflexr's tick and evaluate took, from its last
    `dispatcher stopped:` line (its own thread-CPU figures)."""
    found = re.findall(r"firing_cpu_s=([\d.]+) sending_cpu_s=([\d.]+)", dispatcher_log)
    if not found:
        return 0.0
    firing, sending = (float(x) for x in found[-1])
    return firing / (firing + sending) if firing + sending > 0 else 0.0


def relayr_reactor(runtime: Runtime, *, concurrency: int = 10) -> Reactor[Any]:
    """relayr-ai 0.1.1's in-process reactor over this runtime's stores, with relayr's Outbound."""
    definition = runtime.definition
    workspaces = rw.Workspaces(
        reflexr.sql.SqlStorage(runtime.engine("reflexr")),
        events=[*BRIDGED, *definition.events],
        publishers={"artifactr": [SOURCE]},
        rules=definition.rules,
    )
    outbound = RelayrOutbound(
        runtime.artifactr,
        relayr.sql.SqlLedger(runtime.engine("relayr")),
        allowlists={
            "bench:*": RelayrAllowlist(direct=DIRECT, threads="any"),
            "chaos:*": RelayrAllowlist(direct=DIRECT, threads="any"),
        },
    )

    @dataclass(frozen=True)
    class Deps:
        outbound: RelayrOutbound

    actions = dict(definition.actions(runtime.outbound))
    return Reactor(workspaces, actions=actions, deps=Deps(outbound), concurrency=concurrency)


def run_inprocess(runtime: Runtime, runs: int, workspaces: int = 1) -> Timed:
    names = spread("inprocess", workspaces)
    for workspace in names:
        runtime.run(prepare(runtime.artifactr, TENANT, workspace))
    reactor = relayr_reactor(runtime)
    started = runtime.run(publish(runtime, names, runs, WRITES))
    cpu_before = time.process_time()
    found = runtime.run(_settle_all(runtime, reactor, names, runs))
    result = timed("in-process relayr", found, started)
    result.cpu_ms = {"reactor": (time.process_time() - cpu_before) * 1000 / max(len(found), 1)}
    return result


async def _settle_all(
    runtime: Runtime, reactor: Reactor[Any], workspaces: list[str], runs: int
) -> list[Run]:
    """Settle until every run is terminal: `settle` leaves runs waiting to retry later."""
    while True:
        await reactor.settle(max_rounds=100_000)
        try:
            return await settled_runs(runtime, workspaces, runs, 0)
        except TimeoutError:
            await asyncio.sleep(0.05)


def run_noop(broker_url: str, runs: int, concurrency: int = 2) -> Timed:
    env = {**os.environ, "BENCH_NOOP_BROKER": broker_url}
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "bench.noop", "worker", "-P", "prefork"),
            *("-c", str(concurrency), "-Q", noop.QUEUE, "-l", "WARNING"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    client = redis.Redis.from_url(broker_url)
    sender = Celery("bench-noop-sender", broker=broker_url)
    sender.conf.update(task_serializer="json", accept_content=["json"])
    try:
        client.delete(noop.COUNTER)
        sender.send_task(noop.TASK, queue=noop.QUEUE)  # warm up: wait for the worker
        deadline = time.monotonic() + 60
        while int(client.get(noop.COUNTER) or 0) < 1:
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError("the no-op worker did not start")
            time.sleep(0.05)
        client.delete(noop.COUNTER)
        started = time.monotonic()
        for _ in range(runs):
            sender.send_task(noop.TASK, queue=noop.QUEUE)
        while int(client.get(noop.COUNTER) or 0) < runs:
            time.sleep(0.005)
        return Timed(f"no-op celery c={concurrency}", runs, time.monotonic() - started, [])
    finally:
        os.killpg(worker.pid, 15)
        worker.wait(20)
        client.close()
        sender.close()


async def count_statements(
    runtime: Runtime, counter: SqlCount, writes: int, runs: int
) -> dict[str, dict[str, float]]:
    """Statements and transactions per attempt, by store, for the pool's path and relayr's."""
    from actonce.tasks.attempt import AttemptRef, _attempt
    from actonce.worker.host import WorkerHost

    out: dict[str, dict[str, float]] = {}
    # The pool's path: the attempt task's body, one run at a time, through the Runtime.
    workspace = f"sqlpool{writes}"
    await prepare(runtime.artifactr, TENANT, workspace)
    await publish(runtime, [workspace], runs, writes)
    await runtime.reactor().evaluate()
    ref = WorkspaceRef(TENANT, workspace)
    made = await reflexr.sql.SqlStorage.runs(runtime.reflexr.storage, ref)  # type: ignore[arg-type]
    with counter.counting():
        for run in made:
            await _attempt(
                WorkerHost(runtime),
                AttemptRef(tenant_id=TENANT, workspace_id=workspace, run_id=run.id),
                Counter(),
            )
    out["pool"] = _per(counter, len(made))
    # relayr's path: its reactor's execute over the same number of due runs, one at a time.
    workspace = f"sqlrelayr{writes}"
    await prepare(runtime.artifactr, TENANT, workspace)
    await publish(runtime, [workspace], runs, writes)
    reactor = relayr_reactor(runtime, concurrency=1)
    await reactor.evaluate()
    with counter.counting():
        done = await reactor.execute(limit=runs)
    out["inprocess"] = _per(counter, done)
    return out


def _per(counter: SqlCount, attempts: int) -> dict[str, float]:
    per: dict[str, float] = {}
    for store in STORES:
        per[f"{store}_statements"] = round(counter.statements[store] / max(attempts, 1), 2)
        per[f"{store}_transactions"] = round(counter.transactions[store] / max(attempts, 1), 2)
    per["statements"] = round(sum(counter.statements.values()) / max(attempts, 1), 2)
    per["transactions"] = round(sum(counter.transactions.values()) / max(attempts, 1), 2)
    per["attempts"] = attempts
    return per


# ─── one backend ──────────────────────────────────────────────────────────────


def bench_backend(
    backend: str, runs: int, writes_grid: list[int], workspaces: int = 1
) -> dict[str, Any]:
    with (
        fresh_stores(backend, "actonce_bench") as stores,
        find_or_start_redis(None) as redis_handle,
    ):
        env = pool_env(stores, redis_handle.url)
        env["ACTONCE_LEASE_TTL_S"] = "30"
        settings = Settings.from_env(env)
        asyncio.run(migrate(settings))
        runtime = Runtime(settings, app, one_run=True).open()
        try:
            counter = SqlCount()
            for store in STORES:
                counter.attach(runtime.engine(store))
            statements = {
                w: runtime.run(count_statements(runtime, counter, w, 20)) for w in writes_grid
            }
            contenders = [
                run_pool(runtime, env, runs, 2, redis_handle.pid, workspaces),
                run_pool(runtime, env, runs, 1, redis_handle.pid, workspaces),
                run_inprocess(runtime, runs, workspaces),
                run_noop(redis_handle.url, max(runs, 1000)),
            ]
        finally:
            runtime.close()
    return {**summarise(backend, runs, contenders, statements), "workspaces": workspaces}


def summarise(
    backend: str,
    runs: int,
    contenders: list[Timed],
    statements: dict[int, dict[str, dict[str, float]]],
) -> dict[str, Any]:
    pool2, pool1, inproc, ceiling = contenders
    two = statements.get(WRITES) or statements[min(statements)]
    return {
        "backend": backend,
        "runs": runs,
        "writes_per_attempt": WRITES,
        "pool_attempts_per_s": round(pool2.per_s, 1),
        "pool_1_child_attempts_per_s": round(pool1.per_s, 1),
        "inprocess_attempts_per_s": round(inproc.per_s, 1),
        "noop_tasks_per_s": round(ceiling.per_s, 1),
        "ratio_pool_to_inprocess": round(pool2.per_s / inproc.per_s, 2) if inproc.per_s else None,
        "ratio_pool_1_child_to_inprocess": round(pool1.per_s / inproc.per_s, 2)
        if inproc.per_s
        else None,
        "pool_statements_per_attempt": two["pool"]["statements"],
        "inprocess_statements_per_attempt": two["inprocess"]["statements"],
        "pool_transactions_per_attempt": two["pool"]["transactions"],
        "inprocess_transactions_per_attempt": two["inprocess"]["transactions"],
        "transport_share": round(pool2.per_s / ceiling.per_s, 3) if ceiling.per_s else None,
        "latency_p50_ms": _round(pool2.pct(0.5)),
        "latency_p95_ms": _round(pool2.pct(0.95)),
        "pool_1_child_latency_p50_ms": _round(pool1.pct(0.5)),
        "pool_1_child_latency_p95_ms": _round(pool1.pct(0.95)),
        "inprocess_latency_p50_ms": _round(inproc.pct(0.5)),
        "inprocess_latency_p95_ms": _round(inproc.pct(0.95)),
        "failed_runs": {c.name: c.failed for c in contenders},
        "statements_by_writes": {str(w): s for w, s in statements.items()},
        "pool_cpu_ms_per_attempt": _rounded(pool2.cpu_ms),
        "pool_1_child_cpu_ms_per_attempt": _rounded(pool1.cpu_ms),
        "inprocess_cpu_ms_per_attempt": _rounded(inproc.cpu_ms),
        "machinery_cpu_share": _machinery_share(pool2.cpu_ms),
        "firing_cpu_share": _share(pool2.cpu_ms, "dispatcher_firing"),
    }


def _rounded(cpu_ms: dict[str, float]) -> dict[str, float]:
    return {part: round(ms, 2) for part, ms in cpu_ms.items()}


def _share(cpu_ms: dict[str, float], *parts: str) -> float | None:
    """CPU of `parts` as a share of the attempts' own CPU (the prefork children's)."""
    attempts = cpu_ms.get("attempts") or 0.0
    return round(sum(cpu_ms.get(p, 0.0) for p in parts) / attempts, 3) if attempts else None


def _machinery_share(cpu_ms: dict[str, float]) -> float | None:
    """What Celery, Redis and the dispatcher's sending cost, against the attempts' own CPU."""
    return _share(cpu_ms, "celery", "redis", "dispatcher_sending")


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def report(results: list[dict[str, Any]]) -> list[str]:
    """Print the tables and the targets; return the targets missed."""
    print(f"\nthroughput and latency, {WRITES} writes per attempt (notice + keyed edit)")
    print(
        f"{'backend':<9}{'contender':<20}{'attempts/s':>11}{'× in-proc':>10}"
        f"{'p50 ms':>9}{'p95 ms':>9}"
    )
    for r in results:
        inproc = r["inprocess_attempts_per_s"] or 1
        rows = [
            ("pool c=2", r["pool_attempts_per_s"], r["latency_p50_ms"], r["latency_p95_ms"]),
            (
                "pool c=1",
                r["pool_1_child_attempts_per_s"],
                r["pool_1_child_latency_p50_ms"],
                r["pool_1_child_latency_p95_ms"],
            ),
            (
                "in-process relayr",
                r["inprocess_attempts_per_s"],
                r["inprocess_latency_p50_ms"],
                r["inprocess_latency_p95_ms"],
            ),
            ("no-op celery c=2", r["noop_tasks_per_s"], None, None),
        ]
        for name, rate, p50, p95 in rows:
            print(
                f"{r['backend']:<9}{name:<20}{rate:>11.1f}{rate / inproc:>10.2f}"
                f"{_cell(p50):>9}{_cell(p95):>9}"
            )
    print("\nSQL per attempt (counted in-process on the attempt path; firing excluded)")
    print(f"{'backend':<9}{'writes':>6}  {'path':<10}{'stmts':>8}{'tx':>8}   by store (stmts/tx)")
    for r in results:
        for w, paths in r["statements_by_writes"].items():
            for path in ("pool", "inprocess"):
                s = paths[path]
                stores = " ".join(
                    f"{st}={s[f'{st}_statements']:g}/{s[f'{st}_transactions']:g}"
                    for st in STORES
                    if s[f"{st}_statements"]
                )
                print(
                    f"{r['backend']:<9}{w:>6}  {path:<10}{s['statements']:>8g}"
                    f"{s['transactions']:>8g}   {stores}"
                )
    print("\nCPU ms per attempt, by part (pool: /proc of its processes; in-process: this process)")
    for r in results:
        for name, key in (
            ("pool c=2", "pool_cpu_ms_per_attempt"),
            ("pool c=1", "pool_1_child_cpu_ms_per_attempt"),
            ("in-process relayr", "inprocess_cpu_ms_per_attempt"),
        ):
            parts = r[key]
            detail = " ".join(f"{part}={ms:g}" for part, ms in parts.items())
            print(f"{r['backend']:<9}{name:<20}{sum(parts.values()):>8.1f}   {detail}")
    missed: list[str] = []
    print("\ntargets")
    for r in results:
        b = r["backend"]
        if b == "postgres":
            ok = (r["ratio_pool_to_inprocess"] or 0) >= 1.5
            _target(
                ok, f"{b}: pool c=2 ≥ 1.5× in-process ({r['ratio_pool_to_inprocess']}×)", missed
            )
        for w, paths in r["statements_by_writes"].items():
            pool, inproc = paths["pool"]["statements"], paths["inprocess"]["statements"]
            _target(
                pool <= inproc,
                f"{b}: statements/attempt ≤ relayr's at {w} writes ({pool:g} vs {inproc:g})",
                missed,
            )
        share = r["transport_share"]
        _target(
            share is not None and share < 0.05,
            f"{b}: transport share < 5% ({share:.1%} = pool/no-op rate at 2 children)",
            missed,
        )
        machinery = r["machinery_cpu_share"]
        _target(
            machinery is not None and machinery < 0.05,
            f"{b}: Celery + Redis + dispatcher sending < 5% of the attempts' CPU "
            f"({_percent(machinery)}; firing {_percent(r['firing_cpu_share'])} more)",
            missed,
        )
    return missed


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def _target(ok: bool, text: str, missed: list[str]) -> None:
    print(f"  {'met   ' if ok else 'MISSED'} {text}")
    if not ok:
        missed.append(text)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.bench`: measure, print the tables, write `var/bench.json`."""
    parser = argparse.ArgumentParser(prog="python -m bench.bench", description=__doc__)
    parser.add_argument("--runs", type=int, default=None, help="runs per contender (500)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--quick", action="store_true", help="100 runs, 1 and 10 writes")
    parser.add_argument(
        "--workspaces", type=int, default=1, help="workspaces each contender's runs are dealt over"
    )
    parser.add_argument("--out", type=Path, default=Path("var/bench.json"))
    options = parser.parse_args(argv)
    runs = options.runs or (100 if options.quick else 500)
    grid = [1, WRITES, 10] if options.quick else [1, WRITES, 10, 50]
    results = []
    for backend in options.backends.split(","):
        print(
            f"[{backend}] {runs} runs per contender over {options.workspaces} workspace(s)…",
            flush=True,
        )
        results.append(bench_backend(backend.strip(), runs, grid, options.workspaces))
    report(results)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {options.out}")
    print("transport_share = (1/no-op tasks per s) / (1/pool attempts per s), 2 children each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
