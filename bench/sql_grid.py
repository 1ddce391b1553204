"""SQL per attempt on the attempt path, counted in this process: the pool's and relayr's.

For 1, 2, 10 and 50 writes per attempt, the same rule runs `runs` times through the Celery task's
body (`tasks.attempt._attempt` over a `Runtime`, one run at a time) and through relayr's
`Reactor.execute` (concurrency 1); statements (`before_cursor_execute`) and transactions
(`begin`) are counted by store, the store a statement's table names. Rule evaluation (firing) is
left out of both: the contenders' own figures (`bench.measure`) include it.
"""

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import reflexr.sql
from reflexr.workspace import WorkspaceRef
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import STORES
from bench.definition import BenchRequested, prepare
from bench.reactor_serve import relayr_reactor
from bench.workloads import FEED, TENANT

_TABLE: Final = re.compile(r"\b(reflexr|artifactr|relayr|actonce)_\w+")


class SqlCount:
    """Statements and transactions by store, from engine events, while `counting`."""

    def __init__(self) -> None:
        self.statements: Counter[str] = Counter()
        self.transactions: Counter[str] = Counter()
        self.on = False
        self._attached: set[int] = set()

    def attach(self, engine: AsyncEngine) -> None:
        """Count `engine`'s statements and transactions from now on (once per engine)."""
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
        """Count inside the block only, from zero."""
        self.statements.clear()
        self.transactions.clear()
        self.on = True
        try:
            yield
        finally:
            self.on = False


async def _publish(runtime: Runtime, workspace: str, runs: int, writes: int) -> None:
    opened = await runtime.reflexr.open(TENANT, workspace, actor=FEED)
    events = [BenchRequested(key=f"{workspace}-{i}", writes=writes) for i in range(runs)]
    await opened.publish_many(events, ids=[f"evt_{e.key}" for e in events])


async def attempt_each(runtime: Runtime, workspace: str, run_ids: Iterable[str]) -> None:
    """Attempt each run of `workspace`, one at a time, through the Celery task's body with one
    `WorkerHost`, as a prefork child does."""
    from actonce.tasks.attempt import AttemptRef, _attempt
    from actonce.worker.process.worker_host import WorkerHost

    host = WorkerHost(runtime)
    for run_id in run_ids:
        ref = AttemptRef(tenant_id=TENANT, workspace_id=workspace, run_id=run_id)
        await _attempt(host, ref, Counter())


async def count_statements(
    runtime: Runtime, counter: SqlCount, writes: int, runs: int
) -> dict[str, dict[str, float]]:
    """Statements and transactions per attempt, by store, for the pool's path and relayr's."""
    out: dict[str, dict[str, float]] = {}
    # The pool's path: the attempt task's body, one run at a time, through the Runtime.
    workspace = f"sqlpool{writes}"
    await prepare(runtime.artifactr, TENANT, workspace)
    await _publish(runtime, workspace, runs, writes)
    await runtime.reactor().evaluate()
    ref = WorkspaceRef(TENANT, workspace)
    made = await reflexr.sql.SqlStorage.runs(runtime.reflexr.storage, ref)  # type: ignore[arg-type]
    with counter.counting():
        await attempt_each(runtime, workspace, [run.id for run in made])
    out["pool"] = _per(counter, len(made))
    # relayr's path: its reactor's execute over the same number of due runs, one at a time.
    workspace = f"sqlrelayr{writes}"
    await prepare(runtime.artifactr, TENANT, workspace)
    await _publish(runtime, workspace, runs, writes)
    reactor = relayr_reactor(runtime.engine("reflexr"), concurrency=1)
    await reactor.evaluate()
    with counter.counting():
        done = await reactor.execute(limit=runs)
    out["reactor"] = _per(counter, done)
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


def sql_grid(runtime: Runtime, writes_grid: list[int], runs: int) -> dict[str, Any]:
    """`count_statements` for each number of writes, on `runtime`'s (one-run) stores."""
    counter = SqlCount()
    for store in STORES:
        counter.attach(runtime.engine(store))
    return {str(w): runtime.run(count_statements(runtime, counter, w, runs)) for w in writes_grid}
