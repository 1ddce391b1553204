"""The nudge: PostgreSQL tells the dispatcher that reflexr's log grew, so it polls at once.

Without it, an event appended just after a poll waits for the next one (`ACTONCE_POLL_INTERVAL_S`)
before any rule fires. `install` (run by `actonce migrate` when reflexr's store is PostgreSQL)
adds a statement-level trigger on reflexr's events table that calls `pg_notify` on `CHANNEL` with
the event types the statement appended, whoever appends: the app, relayr's follower, the pool's
own attempts. `Nudges` holds one connection of the dispatcher's that `LISTEN`s there, and `wait`
returns as soon as a notification came with a type some rule may hear: the attempts' own run
facts, which no rule listens to (`worker.listened`), wake nothing. The poll stays the safety
net: a notification is not durable (one sent while no dispatcher listens is lost), so polls go
on, less often while the dispatcher listens, and a dispatcher whose listening connection broke
polls on and listens again later. A database where the trigger is missing (not migrated by this
version) is not listened to: its dispatcher says so once and polls at the full rate. On SQLite
there is no nudge; the poll does it all.
"""

import asyncio
import contextlib
import logging
import time
from typing import Any, Final

import sqlalchemy as sa
from reflexr.sql.tables import EventRow
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger("actonce.dispatcher")

CHANNEL: Final = "actonce_appended"
"""The PostgreSQL notification channel the trigger notifies on every append."""

FUNCTION: Final = "actonce_nudge"
"""The trigger function's name, and the trigger's."""

PAYLOAD_CHARS: Final = 7900
"""The most characters of event types one notification carries."""

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
    # A payload holds at most 8,000 bytes: a cut list ends in a type no rule is quiet on, which
    # wakes the dispatcher, the safe side.
    types = f"left(string_agg(DISTINCT event_type, ','), {PAYLOAD_CHARS})"
    async with engine.begin() as connection:
        await connection.execute(
            sa.text(
                f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS "
                f"$$ BEGIN PERFORM pg_notify('{CHANNEL}', (SELECT {types} FROM appended)); "
                f"RETURN NULL; END $$"
            )
        )
        await connection.execute(sa.text(f"DROP TRIGGER IF EXISTS {FUNCTION} ON {table}"))
        # Per statement, not per row: a batch of appends is one notification, and PostgreSQL
        # folds equal notifications of one transaction into one.
        await connection.execute(
            sa.text(
                f"CREATE TRIGGER {FUNCTION} AFTER INSERT ON {table} "
                f"REFERENCING NEW TABLE AS appended "
                f"FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}()"
            )
        )
    return True


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
        if not payload or any(kind not in self._quiet for kind in payload.split(",")):
            self._heard.set()


async def _triggered(connection: AsyncConnection) -> bool:
    """Whether the nudge trigger is on reflexr's events table."""
    query = sa.text(
        "SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass(:table) AND tgname = :name"
        " AND NOT tgisinternal"
    )
    found = await connection.execute(query, {"table": EventRow.__tablename__, "name": FUNCTION})
    return found.first() is not None
