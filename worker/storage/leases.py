"""reflexr's SQL storage with each lease taken or renewed in one statement, built once.

reflexr's `acquire_lease` runs an `UPDATE` and, when that matched no row, an `INSERT`: two round
trips for every lease that is free, which is every evaluation lease, since an evaluation releases
(deletes) its lease when it ends. Here it is one `INSERT … ON CONFLICT DO UPDATE … WHERE` (free,
expired or already the holder's): the same answers, one statement, and a race between holders is
settled by the database instead of by an `IntegrityError`. The dispatcher's evaluations and a
worker's attempts both lease through it.

Both lease statements, the take and the release, are built once per storage and run on a plain
connection: reflexr builds each anew, and releases through an ORM session, so every lease taken
and released paid again in CPU for statements that never change.

On PostgreSQL each of these statements that stands alone, a take or a release, runs outside
`BEGIN … COMMIT` (`statement_alone`): one round trip, not three, for the same atomic change.

A renewal asked for within `RENEW_FROM_MEMORY` of the lease's ttl after this storage took or
renewed it is answered from memory, with no statement. reflexr's evaluation renews its lease after
every batch, milliseconds after taking it, so even a dispatcher's evaluation of one event sends
statements to renew a lease it has only just taken. Such a lease is certainly still held (no other
holder takes an unexpired lease, and only its holder, through this storage, releases it); its
holder is told so with at least nine tenths of its ttl left, not all of it. The executor's renewals
during a long action, every third of the ttl, always reach the store.

With `keep_released` set, an evaluation lease its holder releases stays taken in the store that long
(`release_kept` deletes it once the time is past): the dispatcher evaluates a busy workspace on
every event, and each evaluation taking and deleting its lease cost two statements. Its next
take within that time, by the same holder, is a renewal, answered as any renewal is. A holder
killed meanwhile leaves the lease until its ttl ends, as one killed while evaluating does.
"""

import contextlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

import reflexr.sql
from lattice_core.sql.sessions import awaited_to_the_end
from reflexr.sql.tables import LeaseRow
from reflexr.workspace import EVALUATION_LEASE, WorkspaceRef
from reflexr.workspace.storage import utc_now
from sqlalchemy import BindParameter, bindparam, delete, or_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from actonce.tasks.sql import DialectInsert, dialect_insert
from actonce.worker.storage.autocommit import StatementsAlone

_LEASES = LeaseRow.__table__

_DIALECTS = frozenset({"postgresql", "sqlite"})
"""What reflexr's SQL storage runs on; both have `INSERT … ON CONFLICT`."""

RENEW_FROM_MEMORY: Final = 0.1
"""The part of a lease's ttl, after a take or renewal reached the store, within which a renewal by
the same holder is answered from memory."""

_MEMO_LIMIT: Final = 1024
"""How many remembered leases make a take forget the lapsed ones."""

type _Lease = tuple[WorkspaceRef, str, str]
"""A lease as this storage remembers it: workspace, key, holder."""


@dataclass(frozen=True)
class _Held:
    """A lease this storage took or renewed, by its clock."""

    at: datetime
    """When the statement that took or renewed it ran."""

    ttl: timedelta
    """What it was taken for: a renewal for another ttl moves its expiry, so it asks the store."""

    def answers(self, now: datetime, ttl: timedelta) -> bool:
        """Whether a renewal for `ttl` at `now` is answered from memory (a clock that went back
        answers nothing)."""
        return ttl == self.ttl and self.at <= now < self.at + ttl * RENEW_FROM_MEMORY


class UpsertLeaseStorage(reflexr.sql.SqlStorage):
    """reflexr's SQL storage whose `acquire_lease` is one upsert, and whose lease statements are
    built once; the rest is reflexr's.

    Row-level security is not supported: the lease statement runs on `engine` as is.

    Args:
        engine: The reflexr store's engine, on PostgreSQL or SQLite.
        **options: As `reflexr.sql.SqlStorage` takes them; its `clock` dates the leases.

    Raises:
        ValueError: With `row_level_security`, or on another database.
    """

    def __init__(self, engine: AsyncEngine, **options: Any) -> None:
        if options.get("row_level_security"):
            raise ValueError("actonce's reflexr storage does not support row-level security")
        if engine.dialect.name not in _DIALECTS:
            raise ValueError(
                f"actonce's reflexr storage runs on PostgreSQL or SQLite, not {engine.dialect.name}"
            )
        super().__init__(engine, **options)
        self._engine = engine
        self._alone = StatementsAlone(engine)
        self._now = options.get("clock", utc_now)
        # Built once: building it, and its cache key, on every take cost a dispatcher at low
        # load CPU on every evaluation, for a statement that never changes.
        self._lease = _lease_statement(dialect_insert(engine.dialect.name))
        self._release = delete(LeaseRow).where(
            _LEASES.c.tenant_id == bindparam("lease_tenant"),
            _LEASES.c.workspace_id == bindparam("lease_workspace"),
            _LEASES.c.key == bindparam("lease_key"),
            _LEASES.c.holder == bindparam("lease_holder"),
        )
        # Each lease this storage took and has not released.
        self._held: dict[_Lease, _Held] = {}
        self.keep_released = timedelta(0)
        """How long an evaluation lease stays taken after its holder released it; none by
        default. Whoever sets it calls `release_kept` regularly, and with `everything=True`
        before it stops."""
        # Each lease released but kept taken in the store, and until when.
        self._kept: dict[_Lease, datetime] = {}

    @awaited_to_the_end
    async def acquire_lease(
        self, workspace: WorkspaceRef, key: str, holder: str, ttl: timedelta
    ) -> bool:
        """Take or renew an exclusive lease in one statement; False if another holder has it.

        A renewal soon after the last statement is answered from memory (`RENEW_FROM_MEMORY`).
        """
        lease = (workspace, key, holder)
        now = self._now()
        self._kept.pop(lease, None)  # taken again: no longer the release's to delete
        held = self._held.get(lease)
        if held is not None and held.answers(now, ttl):
            return True
        self._held.pop(lease, None)
        async with self.statement_alone() as connection:
            taken = await self.take_lease(connection, workspace, key, holder, ttl, now=now)
        if taken:  # committed
            if len(self._held) >= _MEMO_LIMIT:
                self._held = {k: v for k, v in self._held.items() if v.answers(now, v.ttl)}
            self._held[lease] = _Held(now, ttl)
        return taken

    @awaited_to_the_end
    async def release_lease(self, workspace: WorkspaceRef, key: str, holder: str) -> None:
        """Release a lease if `holder` has it; an evaluation lease with `keep_released` is kept
        taken until `release_kept` deletes it."""
        lease = (workspace, key, holder)
        if key == EVALUATION_LEASE and self.keep_released and lease in self._held:
            self._kept[lease] = self._now() + self.keep_released
            return
        self._held.pop(lease, None)
        await self._delete(lease)

    async def release_kept(self, *, everything: bool = False) -> int:
        """Delete the released leases kept past their time, or all of them; return how many
        were deleted."""
        now = self._now()
        due = [lease for lease, until in self._kept.items() if everything or until <= now]
        for lease in due:
            del self._kept[lease]
            self._held.pop(lease, None)
            await self._delete(lease)
        return len(due)

    def statement_alone(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A connection for a statement that needs no transaction around it
        (`worker.storage.autocommit.StatementsAlone`): a lease's take or release is one round trip
        on PostgreSQL, where `BEGIN` and `COMMIT` made three."""
        return self._alone.connect()

    async def _delete(self, lease: _Lease) -> None:
        workspace, key, holder = lease
        async with self.statement_alone() as connection:
            await connection.execute(
                self._release,
                {
                    "lease_tenant": workspace.tenant_id,
                    "lease_workspace": workspace.workspace_id,
                    "lease_key": key,
                    "lease_holder": holder,
                },
            )

    async def take_lease(
        self,
        connection: AsyncConnection,
        workspace: WorkspaceRef,
        key: str,
        holder: str,
        ttl: timedelta,
        *,
        now: datetime | None = None,
    ) -> bool:
        """Take or renew a lease on `connection`, in its transaction; False if refused.

        Use it to take a lease with other work, in one transaction. `now` defaults to the
        storage's clock. A lease so taken is not remembered: its next renewal reaches the store.
        """
        now = self._now() if now is None else now
        taken = await connection.execute(
            self._lease, lease_parameters(workspace, key, holder, ttl, now)
        )
        return bool(taken.rowcount)


def lease_parameters(
    workspace: WorkspaceRef, key: str, holder: str, ttl: timedelta, now: datetime
) -> dict[str, Any]:
    """The parameters of a lease's take or renewal (`taking_lease`) by `holder` at `now`."""
    return {
        "lease_tenant": workspace.tenant_id,
        "lease_workspace": workspace.workspace_id,
        "lease_key": key,
        "lease_holder": holder,
        "lease_expires": now + ttl,
        "lease_now": now,
    }


def _lease_statement(insert: DialectInsert) -> postgresql.Insert | sqlite.Insert:
    """The statement that takes or renews a lease (free, expired or already the holder's); it
    changes one row, or none if refused."""
    return taking_lease(
        insert(LeaseRow).values(
            tenant_id=bindparam("lease_tenant"),
            workspace_id=bindparam("lease_workspace"),
            key=bindparam("lease_key"),
            holder=bindparam("lease_holder"),
            expires_at=bindparam("lease_expires"),
        )
    )


def taking_lease(insert: postgresql.Insert | sqlite.Insert) -> postgresql.Insert | sqlite.Insert:
    """`insert`, an insert of a lease row, made the take or renewal of that lease: on a lease
    already there it changes the row only if the lease is free, expired or already the holder's.

    Its parameters: `lease_holder`, `lease_expires` (what the row is set to) and `lease_now`, as
    `lease_parameters` gives them.
    """
    holder: BindParameter[str] = bindparam("lease_holder")
    expires: BindParameter[datetime] = bindparam("lease_expires")
    return insert.on_conflict_do_update(
        index_elements=[_LEASES.c.tenant_id, _LEASES.c.workspace_id, _LEASES.c.key],
        set_={"holder": holder, "expires_at": expires},
        where=or_(_LEASES.c.holder == holder, _LEASES.c.expires_at <= bindparam("lease_now")),
    )
