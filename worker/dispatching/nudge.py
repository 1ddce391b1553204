"""The nudge: PostgreSQL tells the dispatcher that reflexr's log grew, so it polls at once.

Without it, an event appended just after a poll waits for the next one (`ACTONCE_POLL_INTERVAL_S`)
before any rule fires. `install` (run by `actonce migrate` when reflexr's store is PostgreSQL)
adds a statement-level trigger on reflexr's events table that calls `pg_notify` on `CHANNEL` with
what the statement appended (below), whoever appends: the app, relayr's follower, the pool's
own attempts. `Nudges` holds one connection of the dispatcher's that `LISTEN`s there, and `wait`
returns as soon as a notification came with a type some rule may hear: the attempts' own run
facts, which no rule listens to (`worker.dispatching.rule_listeners`), wake nothing. The poll stays
the safety net: a notification is not durable (one sent while no dispatcher listens is lost), so
polls go on, less often while the dispatcher listens, and a dispatcher whose listening connection
broke polls on and listens again later. A database where the trigger is missing (not migrated by
this version) is not listened to: its dispatcher says so once and polls at the full rate. On SQLite
there is no nudge; the poll does it all.

Each notification says, for each workspace the statement appended to, the first and last `seq`
it appended and their types: ids and type names, no content. A poll woken by appends takes them
(`Nudges.drain`, `Appended`) instead of reading every workspace's head and the types appended
since: it evaluates only the workspaces that grew, as far as they were heard to grow. It reads
the store instead whenever the notifications may not tell all: the first poll after listening
began, after a payload too long to say it (over `PAYLOAD_BYTES`, sent as `*`), and where the
ranges heard leave a gap. The trigger an older actonce installed sent the types alone: every
notification of it wakes the dispatcher, and every poll reads the store, until `actonce migrate`
replaces it.
"""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa
from reflexr.sql.tables import EventRow
from reflexr.workspace import WorkspaceRef
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger("actonce.dispatcher")

CHANNEL: Final = "actonce_appended"
"""The PostgreSQL notification channel the trigger notifies on every append."""

FUNCTION: Final = "actonce_nudge"
"""The trigger function's name, and the trigger's."""

PAYLOAD_BYTES: Final = 7900
"""The longest payload a notification carries (PostgreSQL refuses 8,000 bytes); a longer one is
sent as `UNSAID`."""

UNSAID: Final = "*"
"""The payload of a statement whose appends are too many to list: a poll reads the store."""

RELISTEN_EVERY_S: Final = 5.0
"""How long a dispatcher whose listening failed waits before it tries again."""

RECHECK_TRIGGER_EVERY_S: Final = 60.0
"""How long a dispatcher that found no trigger waits before it looks for one again."""


async def install(engine: AsyncEngine) -> bool:
    """Add the nudge trigger to reflexr's events table, or replace it; return whether it was
    added (only PostgreSQL has one). Idempotent, in one transaction."""
    if engine.dialect.name != "postgresql":
        return False
    table = EventRow.__tablename__
    # One element per workspace the statement appended to: [tenant, workspace, first seq,
    # last seq, [types]].
    appended = (
        "SELECT json_agg(json_build_array(tenant_id, workspace_id, first, last, types))::text"
        " FROM (SELECT tenant_id, workspace_id, min(seq) AS first, max(seq) AS last,"
        " array_agg(DISTINCT event_type) AS types FROM appended"
        " GROUP BY tenant_id, workspace_id) AS grown"
    )
    async with engine.begin() as connection:
        await connection.execute(
            sa.text(
                f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$"
                f" DECLARE payload text; BEGIN payload := ({appended});"
                f" IF payload IS NULL THEN RETURN NULL; END IF;"
                f" IF octet_length(payload) > {PAYLOAD_BYTES} THEN payload := '{UNSAID}'; END IF;"
                f" PERFORM pg_notify('{CHANNEL}', payload); RETURN NULL; END $$"
            )
        )
        await connection.execute(sa.text(f"DROP TRIGGER IF EXISTS {FUNCTION} ON {table}"))
        # Per statement, not per row: a batch of appends is one notification.
        await connection.execute(
            sa.text(
                f"CREATE TRIGGER {FUNCTION} AFTER INSERT ON {table} "
                f"REFERENCING NEW TABLE AS appended "
                f"FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}()"
            )
        )
    return True


@dataclass(frozen=True)
class Grown:
    """Entries one statement appended to one workspace's log."""

    first: int
    """The first `seq` appended."""

    last: int
    """The last `seq` appended."""

    types: frozenset[str]
    """Their event types."""


@dataclass(frozen=True)
class Appended:
    """What the notifications since the last poll said was appended, by workspace."""

    grown: Mapping[WorkspaceRef, Sequence[Grown]]

    def heads(self) -> dict[WorkspaceRef, int]:
        """Each workspace heard of, and the last `seq` heard appended to it."""
        return {ref: max(each.last for each in grown) for ref, grown in self.grown.items()}

    def types(self, ref: WorkspaceRef, after: int, head: int) -> frozenset[str] | None:
        """The types appended to `ref` after `after` up to `head`; None unless the
        notifications heard cover every entry there."""
        covered = after
        types: set[str] = set()
        for each in sorted(self.grown.get(ref, ()), key=lambda grown: grown.first):
            if each.last <= covered:
                continue
            if each.first > covered + 1:
                return None  # entries no notification heard of: read them
            covered = each.last
            types.update(each.types)
        return frozenset(types) if covered >= head else None


class Nudges:
    """The dispatcher's ear on `CHANNEL`: one connection of `engine`'s, held while it listens.

    Args:
        engine: reflexr's store's engine; on anything but PostgreSQL, `wait` only waits.
        quiet: Event types no rule hears: a notification of these alone wakes nothing.
    """

    def __init__(self, engine: AsyncEngine, quiet: frozenset[str] = frozenset()) -> None:
        self._engine = engine
        self._quiet = quiet
        self._heard = asyncio.Event()
        self._grown: dict[WorkspaceRef, list[Grown]] = {}
        # Whether every append since the last `drain` is in `_grown`.
        self._told_all = False
        self._connection: AsyncConnection | None = None
        self._driver: Any = None
        self._next_try = 0.0
        self._warned_untriggered = False
        self.received = 0
        """Notifications heard so far."""

    @property
    def listening(self) -> bool:
        """Whether a notification would wake `wait` now."""
        return self._driver is not None and not self._driver.is_closed()

    async def listen(self) -> None:
        """Start listening, or again after the connection broke; a failure is logged, and the
        next try waits `RELISTEN_EVERY_S`."""
        if self._engine.dialect.name != "postgresql" or self.listening:
            return
        if time.monotonic() < self._next_try:
            return
        await self.close()
        try:
            self._connection = await self._engine.connect()
            if not await _triggered(self._connection):
                self._next_try = time.monotonic() + RECHECK_TRIGGER_EVERY_S
                if not self._warned_untriggered:
                    self._warned_untriggered = True
                    log.warning(
                        "no nudge trigger on reflexr's events table (run `actonce migrate`):"
                        " polling every ACTONCE_POLL_INTERVAL_S instead of listening for appends"
                    )
                await self.close()
                return
            # LISTEN inside a transaction would wait for its commit: end the check's first.
            await self._connection.commit()
            raw = await self._connection.get_raw_connection()
            self._driver = raw.driver_connection
            self._told_all = False  # what was appended before listening began is unheard
            await self._driver.add_listener(CHANNEL, self._notified)
        except Exception as failed:
            self._next_try = time.monotonic() + RELISTEN_EVERY_S
            log.warning("listening for appends failed (%s); polling only for now", failed)
            await self.close()
            return
        # Whatever was appended while no one listened: the next poll looks for it.
        self._heard.set()

    async def wait(self, timeout_s: float) -> bool:
        """Wait until a notification came since the last `wait`, or `timeout_s` passed; return
        whether one came."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._heard.wait(), timeout=timeout_s)
        heard = self._heard.is_set()
        self._heard.clear()
        return heard

    def drain(self) -> Appended | None:
        """What was appended since the last `drain` (nothing, if nothing was), if every append
        was heard; else None, and the poll reads the store. Either way the next `drain` starts
        afresh."""
        grown, told_all = self._grown, self._told_all and self.listening
        self._grown, self._told_all = {}, self.listening
        return Appended(grown) if told_all else None

    async def close(self) -> None:
        """Stop listening and give the connection back; a broken one is discarded."""
        connection, self._connection, self._driver = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.invalidate()
            with contextlib.suppress(Exception):
                await connection.close()

    def _notified(self, _connection: object, _pid: int, _channel: str, payload: str) -> None:
        self.received += 1
        try:
            told = [_told(element) for element in json.loads(payload)]
        except (ValueError, TypeError):
            # `UNSAID`, or a trigger this version did not install: wake, and read the store.
            self._told_all = False
            self._heard.set()
            return
        for ref, grown in told:
            self._grown.setdefault(ref, []).append(grown)
            if not grown.types <= self._quiet:
                self._heard.set()


def _told(element: Any) -> tuple[WorkspaceRef, Grown]:
    """One element of the trigger's payload, `[tenant, workspace, first, last, [types]]`.

    Raises:
        ValueError, TypeError: If it is not of that shape.
    """
    tenant, workspace, first, last, kinds = element
    return WorkspaceRef(str(tenant), str(workspace)), Grown(
        int(first), int(last), frozenset(str(kind) for kind in kinds)
    )


async def _triggered(connection: AsyncConnection) -> bool:
    """Whether the nudge trigger is on reflexr's events table."""
    query = sa.text(
        "SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass(:table) AND tgname = :name"
        " AND NOT tgisinternal"
    )
    found = await connection.execute(query, {"table": EventRow.__tablename__, "name": FUNCTION})
    return found.first() is not None
