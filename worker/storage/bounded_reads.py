"""reflexr's SQL storage whose log reads can be bounded to a head: an evaluation that stops there.

reflexr evaluates a workspace in batches until every rule's cursor reaches the head, and the head
moves while it does: each batch that fires appends its `rule_fired` facts, and the attempts it
set going append their runs' facts. The dispatcher evaluates because of the entries it saw up to
a head; reading on past it cost an evaluation of one event more batches, and more statements, to
read those facts. Whatever lies past that head is the next poll's: the head moved, so the
dispatcher looks again, and evaluates if a rule hears any of it.

Within `reading_up_to(ref, head)` every read of `ref`'s log stops at `head`, as a batch that hit
its size limit stops: reflexr's cursor is the last entry a rule read, so the next evaluation
reads on from there, in the same order, and the rules decide the same. The storage's `head_seq`
of `ref` is `head` there, with no statement: reflexr's evaluation asks it before its batches, to
learn whether any rule is behind, and behind the bound is the only behind it will read (its lag
metric then counts up to the bound). Within a transaction the head is the store's: a rule that
starts there starts at the true head.

Given the rules it evaluates (`reading_up_to(ref, head, rules=...)`), a bound also spares
reflexr's last pass: its evaluation goes on until a pass over every rule finds nothing new, and
once each rule's cursor reached the bound that pass's transactions (a workspace lock and a
progress read each) can find nothing. A transaction begun once every one of `rules` committed, in
this bound, a progress at the bound or past it is answered from that progress, with no statement
(`_Settled`): the evaluation lease, held for the whole evaluation, keeps any other reactor from
moving those cursors meanwhile.

Before its batches, reflexr's evaluation reads every rule's progress (`progress(ref)`), to learn
whether any rule is behind the head and to record each rule's lag. Within a bound given its
rules, that read is answered from the progress this storage last saw committed for them (read, or
written by its own evaluations) when it knows all of them and one is behind the bound: the answer
is then "there is work", as the store's would be, and the batches, under the workspace's lock,
read the true progress before they read or write anything. It saves a dispatcher at low load one
of its statements per event. A rule moved on meanwhile by another dispatcher makes a batch that
finds nothing (and its lag metric, once, reads as before that dispatcher's evaluation); one moved
back (reflexr's `replay`) appends its fact, so the next evaluation is bound past it. When every
known cursor is at the bound, the store is asked: "no work" is never answered from memory.
"""

import contextlib
import contextvars
from collections.abc import AsyncIterator, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from lattice_core.sql.sessions import awaited_to_the_end
from reflexr.core import RuleName, RuleProgress
from reflexr.workspace import WorkspaceRef

from actonce.worker.storage.leases import UpsertLeaseStorage


@dataclass
class _Bound:
    """A bound on one workspace's reads, and what its transactions learned of the rules' cursors."""

    ref: WorkspaceRef
    head: int
    rules: frozenset[str] | None
    """The rules the evaluation within evaluates; None: unknown, every transaction reaches the
    store."""

    caught_up: dict[str, Any] = field(default_factory=dict)
    """Each rule's progress, read or saved by a committed transaction, whose cursor reached
    `head`."""

    def settled(self) -> bool:
        """Whether every rule evaluated within is known to have reached `head`."""
        return self.rules is not None and self.rules <= self.caught_up.keys()


KNOWN_WORKSPACES: Final = 10_000
"""How many workspaces' progress a storage keeps (`BoundedReadStorage.progress`)."""

_BOUND: contextvars.ContextVar[_Bound | None] = contextvars.ContextVar(
    "actonce_read_bound", default=None
)


@contextlib.contextmanager
def reading_up_to(
    ref: WorkspaceRef, head: int, *, rules: Collection[str] | None = None
) -> Iterator[None]:
    """Bound the reads of `ref`'s log by `BoundedReadStorage` to entries up to `head`, within.

    With `rules`, every rule the evaluation within evaluates (and only within one evaluation,
    its lease held), a transaction begun once all of them reached `head` reads nothing.
    """
    token = _BOUND.set(_Bound(ref, head, None if rules is None else frozenset(rules)))
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
        **options: As `worker.storage.leases.UpsertLeaseStorage` takes them.
    """

    def __init__(self, engine: Any, **options: Any) -> None:
        super().__init__(engine, **options)
        # Each workspace's rules' progress as this storage last saw it committed, read or saved.
        self._known: dict[WorkspaceRef, dict[RuleName, RuleProgress]] = {}

    @awaited_to_the_end
    async def progress(self, workspace: WorkspaceRef) -> dict[RuleName, RuleProgress]:
        """Every rule's progress in `workspace`; within a bound given its rules, where the
        progress last seen of each of them is known and one of them is behind the bound, that,
        with no statement."""
        bound = _BOUND.get()
        if bound is not None and bound.ref == workspace and bound.rules:
            known = self._known.get(workspace, {})
            if bound.rules <= known.keys() and any(
                known[rule].cursor < bound.head for rule in bound.rules
            ):
                return {rule: known[rule] for rule in bound.rules}
        found = await super().progress(workspace)
        self._remember(workspace, found)
        return found

    def _remember(self, workspace: WorkspaceRef, progress: dict[RuleName, RuleProgress]) -> None:
        """Keep `progress`, committed, as `workspace`'s last seen, for up to `KNOWN_WORKSPACES`
        workspaces (the oldest is forgotten)."""
        known = self._known.pop(workspace, None)
        if known is None:
            known = {}
            if len(self._known) >= KNOWN_WORKSPACES:
                del self._known[next(iter(self._known))]
        known.update(progress)
        self._known[workspace] = known

    @awaited_to_the_end
    async def head_seq(self, workspace: WorkspaceRef) -> int:
        bound = _BOUND.get()
        if bound is not None and bound.ref == workspace:
            return bound.head
        return await super().head_seq(workspace)

    @contextlib.asynccontextmanager
    async def transaction(self, workspace: WorkspaceRef) -> AsyncIterator[Any]:
        bound = _BOUND.get()
        if bound is None or bound.ref != workspace:
            async with super().transaction(workspace) as transaction:
                yield transaction
            return
        if bound.settled():
            yield _Settled(bound)
            return
        seen: dict[str, Any] = {}
        async with super().transaction(workspace) as transaction:
            _bound_reads(transaction, bound.head, seen)
            yield transaction
        # Committed: a transaction that raised never gets here.
        self._remember(
            workspace, {rule: found for rule, found in seen.items() if found is not None}
        )
        for rule, progress in seen.items():
            if progress is not None and progress.cursor >= bound.head:
                bound.caught_up[rule] = progress
            else:
                bound.caught_up.pop(rule, None)


class _Settled:
    """A transaction of a workspace whose rules all reached the bound: it reads no entry, and
    each rule's progress is the one last committed within the bound.

    reflexr's batch asks it for the head, the rule's progress, and the entries past its cursor,
    finds none, and ends with nothing to write; anything else it is asked is an error, as no
    batch that found no entry asks it.
    """

    def __init__(self, bound: _Bound) -> None:
        self._bound = bound

    async def head_seq(self) -> int:
        return self._bound.head

    async def progress(self, rule: str) -> Any:
        return self._bound.caught_up[rule]

    async def read(self, *, after_seq: int, limit: int) -> list[Any]:
        if after_seq < self._bound.head:
            raise RuntimeError(f"a settled transaction was asked for entries after {after_seq}")
        return []

    async def save_runs(self, runs: Collection[Any]) -> None:
        # There to be wrapped (`worker.storage.committed_runs`); a batch that read nothing saves no
        # run.
        raise RuntimeError("a settled transaction saves no run")


def _bound_reads(transaction: Any, head: int, seen: dict[str, Any]) -> None:
    """Make `transaction.read` return no entry past `head`, and not ask the store for none;
    keep in `seen` each rule's progress as the transaction last read or saved it."""
    read, progress, save_progress = (
        transaction.read,
        transaction.progress,
        transaction.save_progress,
    )

    async def read_up_to(*, after_seq: int, limit: int) -> Any:
        # A workspace's seqs have no gaps, so the room left is a limit.
        room = head - after_seq
        if room <= 0:
            return []
        return await read(after_seq=after_seq, limit=min(limit, room))

    async def progress_seen(rule: str) -> Any:
        found = await progress(rule)
        seen[rule] = found
        return found

    async def save_progress_seen(rule: str, saved: Any) -> None:
        await save_progress(rule, saved)
        seen[rule] = saved

    transaction.read = read_up_to
    transaction.progress = progress_seen
    transaction.save_progress = save_progress_seen
