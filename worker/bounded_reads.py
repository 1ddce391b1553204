"""reflexr's SQL storage whose log reads can be bounded to a head: an evaluation that stops there.

reflexr evaluates a workspace in batches until every rule's cursor reaches the head, and the head
moves while it does: each batch that fires appends its `rule_fired` facts, and the attempts it
set going append their runs' facts. The dispatcher evaluates because of the entries it saw up to
a head; reading on past it cost an evaluation of one event two or three more batches (13 of its
34 statements) to read those facts. Whatever lies past that head is the next poll's: the head
moved, so the dispatcher looks again, and evaluates if a rule hears any of it.

Within `reading_up_to(ref, head)` every read of `ref`'s log stops at `head`, as a batch that hit
its size limit stops: reflexr's cursor is the last entry a rule read, so the next evaluation
reads on from there, in the same order, and the rules decide the same. The storage's `head_seq`
of `ref` is `head` there, with no statement: reflexr's evaluation asks it before its batches, to
learn whether any rule is behind, and behind the bound is the only behind it will read (its lag
metric then counts up to the bound). Within a transaction the head is the store's: a rule that
starts there starts at the true head.
"""

import contextlib
import contextvars
from collections.abc import AsyncIterator, Iterator
from typing import Any

from lattice_core.sql.sessions import awaited_to_the_end
from reflexr.workspace import WorkspaceRef

from actonce.worker.leases import UpsertLeaseStorage

_BOUND: contextvars.ContextVar[tuple[WorkspaceRef, int] | None] = contextvars.ContextVar(
    "actonce_read_bound", default=None
)


@contextlib.contextmanager
def reading_up_to(ref: WorkspaceRef, head: int) -> Iterator[None]:
    """Bound the reads of `ref`'s log by `BoundedReadStorage` to entries up to `head`, within."""
    token = _BOUND.set((ref, head))
    try:
        yield
    finally:
        _BOUND.reset(token)


class BoundedReadStorage(UpsertLeaseStorage):
    """reflexr's SQL storage whose transactions' `read` stops at the bound `reading_up_to` set,
    and whose `head_seq` is that bound.

    Outside `reading_up_to`, and for other workspaces, its reads are reflexr's.

    Args:
        engine: The reflexr store's engine.
        **options: As `worker.leases.UpsertLeaseStorage` takes them.
    """

    @awaited_to_the_end
    async def head_seq(self, workspace: WorkspaceRef) -> int:
        bound = _BOUND.get()
        if bound is not None and bound[0] == workspace:
            return bound[1]
        return await super().head_seq(workspace)

    @contextlib.asynccontextmanager
    async def transaction(self, workspace: WorkspaceRef) -> AsyncIterator[Any]:
        async with super().transaction(workspace) as transaction:
            bound = _BOUND.get()
            if bound is not None and bound[0] == workspace:
                _bound_reads(transaction, bound[1])
            yield transaction


def _bound_reads(transaction: Any, head: int) -> None:
    """Make `transaction.read` return no entry past `head`, and not ask the store for none."""
    read = transaction.read

    async def read_up_to(*, after_seq: int, limit: int) -> Any:
        # A workspace's seqs have no gaps, so the room left is a limit.
        room = head - after_seq
        if room <= 0:
            return []
        return await read(after_seq=after_seq, limit=min(limit, room))

    transaction.read = read_up_to
