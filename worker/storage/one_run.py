"""The one-run view of reflexr's SQL storage: what a worker's executor sees during one attempt.

reflexr's executor attempts whatever `due_runs` answers. A worker must attempt exactly the run its
message names, so its storage answers `due_runs` with that run alone (named in a `ContextVar`,
which each asyncio task copies), and nothing outside an attempt. Everything else (the lease, the
claim that re-checks status, due time, scope and epoch, the outcome fenced by epoch) is reflexr's.

Four savings, because a pool makes one attempt per message and pays per statement:

- the run as the attempt's last committed transaction saved it is kept, so the task settles on it
  without reading the run back;
- a lease is taken in one statement, as every actonce process takes it (`worker.storage.leases`);
- when the attempt names its holder, the run's lease is taken in the transaction that reads the
  run for `due_runs`, and the executor's first ask for it, a moment later, is answered from that:
  one transaction fewer per attempt; on PostgreSQL the read and the take are one statement, in
  autocommit (`_claim_statement`): one round trip where there were four;
- the claim of a run whose rule does not order its runs (`ordering="none"`) is answered from that
  run alone, as the claim has just read it (`_OwnScope`), not from every unfinished run of its
  scope.
"""

import contextlib
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from lattice_core.sql.sessions import awaited_to_the_end
from reflexr.core import Run
from reflexr.sql.tables import LeaseRow, RunRow
from reflexr.workspace import RunPolicy, WorkspaceRef, run_lease
from sqlalchemy import DateTime, Select, String, bindparam, exists, func, literal_column, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine

from actonce.worker.storage.committed_runs import ReportingStorage
from actonce.worker.storage.leases import lease_parameters, taking_lease

_RUNS = RunRow.__table__


@dataclass
class AttemptTarget:
    """The run one attempt is about, and how its committed transactions left it."""

    ref: WorkspaceRef
    """The run's workspace."""

    run_id: str
    """The run's id."""

    saved: Run | None = None
    """The run as the last committed transaction of this attempt saved it; None if none did."""

    holder: str | None = None
    """The executor's name in leases, if the run's lease is to be taken with its read."""

    ttl: timedelta | None = None
    """How long the executor's leases last; given with `holder`."""

    leased: bool | None = None
    """Whether the run's lease was taken with its read; None until then, and once the executor
    has asked for it (its renewals go to the store)."""


_TARGET: contextvars.ContextVar[AttemptTarget | None] = contextvars.ContextVar(
    "actonce_attempt_target", default=None
)


@contextlib.contextmanager
def attempting(
    ref: WorkspaceRef, run_id: str, *, holder: str | None = None, ttl: timedelta | None = None
) -> Iterator[AttemptTarget]:
    """Make `run_id` the one run the storage offers, in this context and the tasks it starts.

    With `holder` and `ttl` (the executor's), the run's lease is taken with its read; a lease so
    taken that the executor never asked for stays held until it expires: release it if
    `target.leased` is still True at the end.
    """
    if (holder is None) != (ttl is None):
        raise ValueError("give both the holder and the ttl of the executor's leases, or neither")
    target = AttemptTarget(ref, run_id, holder=holder, ttl=ttl)
    token = _TARGET.set(target)
    try:
        yield target
    finally:
        _TARGET.reset(token)


class OneRunStorage(ReportingStorage):
    """reflexr's SQL storage whose `due_runs` is the one run the current attempt names.

    Outside an attempt it answers nothing, never "whatever is due", so a worker runs only what it
    was sent. Row-level security is not supported: the lease statement runs on `engine` as is.

    Args:
        engine: The reflexr store's engine.
        unordered_rules: The rules whose runs start regardless of the other runs of their scope
            (`ordering="none"`). Name only code rules: the answer for any other rule is
            reflexr's own.
        **options: As `reflexr.sql.SqlStorage` takes them.
    """

    def __init__(
        self, engine: AsyncEngine, *, unordered_rules: Iterable[str] = (), **options: Any
    ) -> None:
        super().__init__(engine, **options)
        self._unordered = frozenset(unordered_rules)
        # Built once, as the lease statements are (`worker.storage.leases`).
        self._read_run = select(_RUNS.c.body).where(
            _RUNS.c.tenant_id == bindparam("run_tenant"),
            _RUNS.c.workspace_id == bindparam("run_workspace"),
            _RUNS.c.id == bindparam("run_id"),
        )
        self._claim = (
            _claim_statement(self._read_run) if engine.dialect.name == "postgresql" else None
        )

    async def due_runs(
        self, *, now: datetime, limit: int, policy: RunPolicy
    ) -> list[tuple[WorkspaceRef, Run]]:
        target = _TARGET.get()
        if target is None:
            return []
        if target.holder is None or target.ttl is None:
            found = await self.run(target.ref, target.run_id)
        else:
            found, target.leased = await self._read_and_lease(target, target.holder, target.ttl)
        return [] if found is None else [(target.ref, found)]

    @contextlib.asynccontextmanager
    async def transaction(self, workspace: WorkspaceRef) -> AsyncIterator[Any]:
        target = _TARGET.get()
        async with super().transaction(workspace) as transaction:
            if target is not None and target.ref == workspace and self._unordered:
                _OwnScope.install(transaction, target.run_id, self._unordered)
            yield transaction

    def reports(self, workspace: WorkspaceRef) -> bool:
        target = _TARGET.get()
        return target is not None and target.ref == workspace

    def committed(self, workspace: WorkspaceRef, runs: Sequence[Run]) -> None:
        target = _TARGET.get()
        if target is not None:
            for run in runs:
                if run.id == target.run_id:
                    target.saved = run
        super().committed(workspace, runs)

    @awaited_to_the_end
    async def acquire_lease(
        self, workspace: WorkspaceRef, key: str, holder: str, ttl: timedelta
    ) -> bool:
        """Take or renew an exclusive lease in one statement; False if another holder has it.

        The attempt's executor's first ask for its run's lease is answered from `due_runs`,
        which took it with the run's read.
        """
        target = _TARGET.get()
        if (
            target is not None
            and target.leased is not None
            and (workspace, key, holder) == (target.ref, run_lease(target.run_id), target.holder)
        ):
            leased, target.leased = target.leased, None
            return leased
        return await super().acquire_lease(workspace, key, holder, ttl)

    @awaited_to_the_end
    async def _read_and_lease(
        self, target: AttemptTarget, holder: str, ttl: timedelta
    ) -> tuple[Run | None, bool | None]:
        """Read the target run and, if there is one, take its lease: in one statement on
        PostgreSQL (`_claim_statement`), in one transaction elsewhere."""
        workspace = target.ref
        run = {
            "run_tenant": workspace.tenant_id,
            "run_workspace": workspace.workspace_id,
            "run_id": target.run_id,
        }
        key = run_lease(target.run_id)
        if self._claim is not None:
            lease = lease_parameters(workspace, key, holder, ttl, self._now())
            async with self.statement_alone() as connection:
                row = (await connection.execute(self._claim, {**run, **lease})).first()
            return (None, None) if row is None else (Run.model_validate(row[0]), bool(row[1]))
        async with self._engine.begin() as connection:
            body = await connection.scalar(self._read_run, run)
            if body is None:
                return None, None
            taken = await self.take_lease(connection, workspace, key, holder, ttl)
        return Run.model_validate(body), taken


def _claim_statement(read_run: Select[tuple[Any]]) -> Select[tuple[Any, int]]:
    """PostgreSQL's read of a run (`read_run`) with the take of its lease, in one statement: a
    row of the run's body and how many leases it took (1, or 0 if another holder has it), or no
    row and no lease taken if there is no such run.

    Its parameters: `read_run`'s and `lease_parameters`'. A data-modifying `WITH` runs once,
    whether or not the query reads it, and sees the same snapshot as the read: the answer is the
    two statements' in one transaction under READ COMMITTED.
    """
    run = read_run.cte("run")
    leasing = select(
        bindparam("lease_tenant", type_=String),
        bindparam("lease_workspace", type_=String),
        bindparam("lease_key", type_=String),
        bindparam("lease_holder", type_=String),
        bindparam("lease_expires", type_=DateTime(timezone=True)),
    ).where(exists(run.select()))
    columns = ["tenant_id", "workspace_id", "key", "holder", "expires_at"]
    taken = (
        taking_lease(postgresql.insert(LeaseRow).from_select(columns, leasing))
        .returning(literal_column("1"))
        .cte("taken")
    )
    return select(run.c.body, select(func.count()).select_from(taken).scalar_subquery())


class _OwnScope:
    """A transaction's `scope_runs` during one attempt: for the attempted run's own rule and scope,
    when the rule is unordered, the run alone (as this transaction reads it); otherwise reflexr's.

    reflexr's claim asks for every unfinished run of the scope and keeps the run only if
    `runnable` lists it. For an unordered rule `runnable` is every waiting, due run of the list,
    which the claim has just checked the run is: the other runs cannot change the answer. Reading
    and decoding them all, under the workspace row's lock, made each attempt of a burst in one
    scope pay for every run of the burst, a cost that grew with the burst. Nothing else asks for a
    scope within an attempt's transactions, so no other answer changes.

    The run is the one the claim read in this transaction, kept from its `run` (the session's
    identity map holds rows weakly: a second read was a second SELECT); a save drops it.
    """

    def __init__(self, transaction: Any, run_id: str, unordered: frozenset[str]) -> None:
        self._read: Callable[[str], Awaitable[Run | None]] = transaction.run
        self._save: Callable[[Sequence[Run]], Awaitable[None]] = transaction.save_runs
        self._every: Callable[[str, str], Awaitable[list[Run]]] = transaction.scope_runs
        self._run_id = run_id
        self._unordered = unordered
        self._kept: Run | None = None

    @classmethod
    def install(cls, transaction: Any, run_id: str, unordered: frozenset[str]) -> None:
        """Answer `transaction`'s `scope_runs` so, keeping its reads of `run_id` for it."""
        own = cls(transaction, run_id, unordered)
        transaction.run = own._run
        transaction.save_runs = own._save_runs
        transaction.scope_runs = own

    async def _run(self, run_id: str) -> Run | None:
        run = await self._read(run_id)
        if run_id == self._run_id:
            self._kept = run
        return run

    async def _save_runs(self, runs: Sequence[Run]) -> None:
        self._kept = None
        await self._save(runs)

    async def __call__(self, rule: str, scope_key: str) -> list[Run]:
        if rule not in self._unordered:
            return await self._every(rule, scope_key)
        run = self._kept if self._kept is not None else await self._read(self._run_id)
        if run is None or run.rule != rule or run.scope_key != scope_key:
            return await self._every(rule, scope_key)
        return [] if run.status == "succeeded" else [run]
