"""Dead letters: a durable, inspectable store of every job the pool gave up on.

Nothing is dropped. The store keeps the first letter of an id and never overwrites it, so a
duplicate delivery that dead-letters a run again is harmless (the letter itself, and how its id
is derived, is `worker.dead_letters.letter`).

`DeadLetters` is the port; `SqlDeadLetters` keeps letters in the table `actonce_dead_letters` on
SQLite or PostgreSQL (made by actonce's migrations, `actonce migrate`, never by a worker at
start), and `InMemoryDeadLetters` is its twin for tests. One behaviour suite runs over all of
them. Replaying a letter is the operator's (`actonce dead replay`): reflexr's `retry_run` makes
the run pending again, and `mark_replayed` records that it was done.
"""

import builtins
from collections.abc import Sequence
from datetime import datetime
from typing import Final, Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from actonce.tasks.sql import UtcDateTime, aware_utc, insert_once
from actonce.worker.dead_letters.letter import (
    DEAD_LETTER,
    RAW_LIMIT_BYTES,
    RAW_TRUNCATED_MARKER,
    DeadLetter,
    intake_letter_id,
    raw_letter_id,
    raw_text,
    run_letter_id,
)

__all__ = [
    "DEAD_LETTER",
    "DEAD_LETTERS_TABLE",
    "RAW_LIMIT_BYTES",
    "RAW_TRUNCATED_MARKER",
    "TABLE_NAME",
    "DeadLetter",
    "DeadLetters",
    "InMemoryDeadLetters",
    "SqlDeadLetters",
    "intake_letter_id",
    "raw_letter_id",
    "raw_text",
    "run_letter_id",
]
"""The store, and the letter it keeps, so a caller of the store needs one import."""

TABLE_NAME: Final = "actonce_dead_letters"
"""The SQL table dead letters are kept in."""


class DeadLetters(Protocol):
    """Where dead letters are kept: each once, by its id, until it is purged.

    Letters are listed newest first (by `dead_at`, then by id, descending). A letter is replayed
    when `replayed_at` is set; `list` and `count` leave replayed letters out unless asked.
    """

    async def add(self, letter: DeadLetter, /) -> bool:
        """Keep a letter, unless one with its id is kept already, which is left as it is.

        Returns:
            `True` if the letter is new, `False` if its id was kept already (a duplicate).
        """
        ...

    async def get(self, letter_id: str, /) -> DeadLetter | None:
        """Return the letter with this id, or `None` if there is none."""
        ...

    async def list(
        self,
        *,
        limit: int = 100,
        reason: str | None = None,
        tenant_id: str | None = None,
        workspace_id: str | None = None,
        include_replayed: bool = False,
    ) -> builtins.list[DeadLetter]:
        """Return letters newest first, at most `limit`, with the reason, tenant, workspace given.

        Raises:
            ValueError: If `limit` is below 1.
        """
        ...

    async def mark_replayed(self, letter_id: str, at: datetime, /) -> DeadLetter:
        """Record that a letter was replayed at `at`: set `replayed_at`, count one more replay.

        Returns:
            The letter as it is now kept.

        Raises:
            KeyError: If there is no letter with this id.
            ValueError: If `at` is naive.
        """
        ...

    async def purge(
        self,
        *,
        ids: Sequence[str] | None = None,
        older_than: datetime | None = None,
        replayed_only: bool = False,
        everything: bool = False,
    ) -> int:
        """Remove letters that match every filter given; all of them only if `everything`.

        Args:
            ids: Only the letters with these ids (an empty sequence matches none).
            older_than: Only letters dead before this time (timezone-aware).
            replayed_only: Only letters that were replayed.
            everything: Remove every letter; given with no other filter.

        Returns:
            How many letters were removed.

        Raises:
            ValueError: If no filter is given and not `everything`, or `everything` is given with
                a filter, or `ids` is a single string, or `older_than` is naive.
        """
        ...

    async def count(self, *, include_replayed: bool = False) -> int:
        """Return how many letters are kept, leaving out replayed ones unless asked."""
        ...


class InMemoryDeadLetters:
    """Dead letters in this process's memory: for tests and examples, lost when it ends.

    Per process, so a worker pool's processes do not share them; use `SqlDeadLetters` to keep
    letters.
    """

    def __init__(self) -> None:
        self._letters: dict[str, DeadLetter] = {}

    async def add(self, letter: DeadLetter, /) -> bool:
        """Keep a letter unless its id is kept; see `DeadLetters.add`."""
        if letter.id in self._letters:
            return False
        self._letters[letter.id] = letter
        return True

    async def get(self, letter_id: str, /) -> DeadLetter | None:
        """Return the letter with this id, or `None`; see `DeadLetters.get`."""
        return self._letters.get(letter_id)

    async def list(
        self,
        *,
        limit: int = 100,
        reason: str | None = None,
        tenant_id: str | None = None,
        workspace_id: str | None = None,
        include_replayed: bool = False,
    ) -> builtins.list[DeadLetter]:
        """Return letters newest first; see `DeadLetters.list`."""
        _check_limit(limit)
        chosen = [
            letter
            for letter in self._letters.values()
            if (reason is None or letter.reason == reason)
            and (tenant_id is None or letter.tenant_id == tenant_id)
            and (workspace_id is None or letter.workspace_id == workspace_id)
            and (include_replayed or letter.replayed_at is None)
        ]
        chosen.sort(key=lambda letter: (letter.dead_at, letter.id), reverse=True)
        return chosen[:limit]

    async def mark_replayed(self, letter_id: str, at: datetime, /) -> DeadLetter:
        """Record a replay; see `DeadLetters.mark_replayed`."""
        replayed_at = aware_utc(at, "at")
        letter = self._letters.get(letter_id)
        if letter is None:
            raise _missing(letter_id)
        replayed = letter.model_copy(
            update={"replayed_at": replayed_at, "replays": letter.replays + 1}
        )
        self._letters[letter_id] = replayed
        return replayed

    async def purge(
        self,
        *,
        ids: Sequence[str] | None = None,
        older_than: datetime | None = None,
        replayed_only: bool = False,
        everything: bool = False,
    ) -> int:
        """Remove matching letters; see `DeadLetters.purge`."""
        _check_purge(ids, older_than, replayed_only, everything)
        cutoff = None if older_than is None else aware_utc(older_than, "older_than")
        wanted = None if ids is None else set(ids)
        doomed = [
            letter.id
            for letter in self._letters.values()
            if (wanted is None or letter.id in wanted)
            and (cutoff is None or letter.dead_at < cutoff)
            and (not replayed_only or letter.replayed_at is not None)
        ]
        for letter_id in doomed:
            del self._letters[letter_id]
        return len(doomed)

    async def count(self, *, include_replayed: bool = False) -> int:
        """Return how many letters are kept; see `DeadLetters.count`."""
        return sum(
            1 for letter in self._letters.values() if include_replayed or letter.replayed_at is None
        )


class SqlDeadLetters:
    """Dead letters in the SQL table `actonce_dead_letters`, shared by every process.

    Works on SQLite (an engine from `artifactr.sql.create_sqlite_engine`) and on PostgreSQL
    (asyncpg); any `AsyncEngine` will do. The table must exist: actonce's migrations make it
    (`actonce migrate`, or `actonce.worker.storage.migrate.migrate_own_tables`).

    Args:
        engine: The engine of the database the table is in.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def add(self, letter: DeadLetter, /) -> bool:
        """Keep a letter unless its id is kept; see `DeadLetters.add`.

        Two processes adding the same letter at once make one row: the database decides.
        """
        row = letter.model_dump()
        async with self._engine.begin() as connection:
            return await insert_once(connection, DEAD_LETTERS_TABLE, row)

    async def get(self, letter_id: str, /) -> DeadLetter | None:
        """Return the letter with this id, or `None`; see `DeadLetters.get`."""
        async with self._engine.connect() as connection:
            return await _read(connection, letter_id)

    async def list(
        self,
        *,
        limit: int = 100,
        reason: str | None = None,
        tenant_id: str | None = None,
        workspace_id: str | None = None,
        include_replayed: bool = False,
    ) -> builtins.list[DeadLetter]:
        """Return letters newest first; see `DeadLetters.list`."""
        _check_limit(limit)
        query = sa.select(DEAD_LETTERS_TABLE)
        if reason is not None:
            query = query.where(_COLUMNS.reason == reason)
        if tenant_id is not None:
            query = query.where(_COLUMNS.tenant_id == tenant_id)
        if workspace_id is not None:
            query = query.where(_COLUMNS.workspace_id == workspace_id)
        if not include_replayed:
            query = query.where(_COLUMNS.replayed_at.is_(None))
        query = query.order_by(_COLUMNS.dead_at.desc(), _COLUMNS.id.desc()).limit(limit)
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query)).mappings().all()
        return [DeadLetter.model_validate(dict(row)) for row in rows]

    async def mark_replayed(self, letter_id: str, at: datetime, /) -> DeadLetter:
        """Record a replay; see `DeadLetters.mark_replayed`."""
        replayed_at = aware_utc(at, "at")
        update = (
            sa.update(DEAD_LETTERS_TABLE)
            .where(_COLUMNS.id == letter_id)
            .values(replayed_at=replayed_at, replays=_COLUMNS.replays + 1)
        )
        async with self._engine.begin() as connection:
            await connection.execute(update)
            letter = await _read(connection, letter_id)
        if letter is None:
            raise _missing(letter_id)
        return letter

    async def purge(
        self,
        *,
        ids: Sequence[str] | None = None,
        older_than: datetime | None = None,
        replayed_only: bool = False,
        everything: bool = False,
    ) -> int:
        """Remove matching letters; see `DeadLetters.purge`."""
        _check_purge(ids, older_than, replayed_only, everything)
        where: list[sa.ColumnElement[bool]] = []
        if older_than is not None:
            where.append(_COLUMNS.dead_at < aware_utc(older_than, "older_than"))
        if replayed_only:
            where.append(_COLUMNS.replayed_at.is_not(None))
        # Ids go in batches: drivers bound how many parameters one statement may have.
        batches: builtins.list[builtins.list[str] | None] = (
            [None] if ids is None else [*_batches(builtins.list(dict.fromkeys(ids)))]
        )
        removed = 0
        async with self._engine.begin() as connection:
            for batch in batches:
                chosen = where if batch is None else [*where, _COLUMNS.id.in_(batch)]
                result = await connection.execute(sa.delete(DEAD_LETTERS_TABLE).where(*chosen))
                removed += result.rowcount
        return removed

    async def count(self, *, include_replayed: bool = False) -> int:
        """Return how many letters are kept; see `DeadLetters.count`."""
        query = sa.select(sa.func.count()).select_from(DEAD_LETTERS_TABLE)
        if not include_replayed:
            query = query.where(_COLUMNS.replayed_at.is_(None))
        async with self._engine.connect() as connection:
            return int((await connection.execute(query)).scalar_one())


# ─── how ──────────────────────────────────────────────────────────────────────


DEAD_LETTERS_TABLE: Final = sa.Table(
    TABLE_NAME,
    sa.MetaData(),
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant_id", sa.Text, nullable=True),
    sa.Column("workspace_id", sa.Text, nullable=True),
    sa.Column("run_id", sa.Text, nullable=True),
    sa.Column("rule", sa.Text, nullable=True),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("error", sa.Text, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("task_id", sa.Text, nullable=True),
    sa.Column("queue", sa.Text, nullable=True),
    sa.Column("raw", sa.Text, nullable=True),
    sa.Column("raw_encoding", sa.Text, nullable=True),
    sa.Column("raw_bytes", sa.Integer, nullable=True),
    sa.Column("dead_at", UtcDateTime, nullable=False),
    sa.Column("replayed_at", UtcDateTime, nullable=True),
    sa.Column("replays", sa.Integer, nullable=False),
    sa.Index(f"ix_{TABLE_NAME}_dead_at", "dead_at"),
)
"""The table dead letters are kept in, in a `MetaData` of its own: a column per field."""

_COLUMNS: Final = DEAD_LETTERS_TABLE.c

_ID_BATCH: Final = 500
"""How many ids one `DELETE` names, well under every driver's bound on parameters."""


async def _read(connection: AsyncConnection, letter_id: str) -> DeadLetter | None:
    query = sa.select(DEAD_LETTERS_TABLE).where(_COLUMNS.id == letter_id)
    row = (await connection.execute(query)).mappings().one_or_none()
    return None if row is None else DeadLetter.model_validate(dict(row))


def _check_limit(limit: int) -> None:
    if limit < 1:
        raise ValueError(f"limit must be 1 or more, such as limit=100, not {limit}")


def _check_purge(
    ids: Sequence[str] | None, older_than: datetime | None, replayed_only: bool, everything: bool
) -> None:
    """Refuse a purge that would empty the store by accident, or whose `ids` is one string."""
    if isinstance(ids, str):
        raise ValueError(f"ids is a sequence of ids, such as ids=[{ids!r}], not one string")
    filtered = ids is not None or older_than is not None or replayed_only
    if everything and filtered:
        raise ValueError("purge(everything=True) takes no filter: give either, not both")
    if not everything and not filtered:
        raise ValueError(
            "purge needs a filter (ids=, older_than= or replayed_only=True); "
            "to remove every letter, say purge(everything=True)"
        )


def _missing(letter_id: str) -> KeyError:
    return KeyError(f"no dead letter {letter_id!r}: it was never added, or was purged")


def _batches(ids: builtins.list[str]) -> builtins.list[builtins.list[str]]:
    return [ids[start : start + _ID_BATCH] for start in range(0, len(ids), _ID_BATCH)]
