"""reflexr's SQL storage that tells its listeners which runs each transaction saved, once committed.

A worker's attempt settles on the run its last transaction saved (`worker.storage.one_run`), and the
dispatcher sends the runs an evaluation batch fired as soon as that batch commits, not after the
whole evaluation (`worker.dispatching.dispatcher`). Both learn it here: a transaction that raised,
and so rolled back, reports nothing.
"""

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from reflexr.core import Run
from reflexr.workspace import WorkspaceRef

from actonce.worker.storage.bounded_reads import BoundedReadStorage

type RunsListener = Callable[[WorkspaceRef, Sequence[Run]], None]
"""Called with a workspace and the runs a committed transaction of it saved, in order."""


class ReportingStorage(BoundedReadStorage):
    """reflexr's SQL storage that reports the runs each committed transaction saved.

    Without a listener its transactions are reflexr's, statement for statement (its leases are
    `worker.storage.leases`', its reads bounded as `worker.storage.bounded_reads` says). Listeners
    run in the loop right after the commit, before the transaction's caller goes on: they must not
    block.

    Args:
        engine: The reflexr store's engine.
        **options: As `worker.storage.leases.UpsertLeaseStorage` takes them.
    """

    def __init__(self, engine: Any, **options: Any) -> None:
        super().__init__(engine, **options)
        self._listeners: list[RunsListener] = []

    def listen(self, listener: RunsListener) -> None:
        """Call `listener` after each committed transaction that saved runs."""
        self._listeners.append(listener)

    def reports(self, workspace: WorkspaceRef) -> bool:
        """Whether a transaction of `workspace` is watched for the runs it saves."""
        return bool(self._listeners)

    def committed(self, workspace: WorkspaceRef, runs: Sequence[Run]) -> None:
        """Hand the runs a committed transaction of `workspace` saved to every listener."""
        for listener in self._listeners:
            listener(workspace, runs)

    @contextlib.asynccontextmanager
    async def transaction(self, workspace: WorkspaceRef) -> AsyncIterator[Any]:
        if not self.reports(workspace):
            async with super().transaction(workspace) as plain:
                yield plain
            return
        saved: list[Run] = []
        async with super().transaction(workspace) as recorded:
            save_runs = recorded.save_runs

            async def save_and_keep(runs: Sequence[Run]) -> None:
                await save_runs(runs)
                saved.extend(runs)

            recorded.save_runs = save_and_keep
            yield recorded
        # Past the parent's commit: a transaction that raised never gets here.
        if saved:
            self.committed(workspace, saved)
