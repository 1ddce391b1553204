"""Dead letters: a durable, inspectable record of every job the pool gave up on.

Nothing is dropped. A run reflexr dead-lettered (a permanent `RunFailure`, or its attempts ran
out) is kept with its reason code, and so is a message that could not even be parsed, with its raw
body and why it was refused. A letter's id is derived: a duplicate delivery of the same attempt
dead-letters the run under the same id, and the store keeps the first letter of an id and never
overwrites it, so the duplicate is harmless.

`DeadLetters` is the port; `SqlDeadLetters` keeps letters in the table `actonce_dead_letters` on
SQLite or PostgreSQL (made by `create_dead_letter_table`, from the `migrate` step, never by a
worker at start), and `InMemoryDeadLetters` is its twin for tests. One behaviour suite runs over
all of them. Replaying a letter is the operator's: reflexr's `retry_run` makes the run pending
again, and `mark_replayed` records that it was done.
"""

import builtins
import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final, Protocol, Self

import sqlalchemy as sa
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from actonce.tasks.sql import UtcDateTime, aware_utc, insert_once

DEAD_LETTER: Final = "dl_"
"""The prefix of a dead letter's id."""

DIGEST_LENGTH: Final = 16
"""How many hex characters of the SHA-256 a dead letter's id keeps."""

MALFORMED_MESSAGE: Final = "malformed_message"
"""The reason of a letter for a message that could not be parsed or validated."""

RAW_LIMIT_BYTES: Final = 64 * 1024
"""The most UTF-8 bytes of a malformed message's body a letter keeps, the marker included."""

RAW_TRUNCATED_MARKER: Final = "\n[... truncated by actonce: the body had {total_bytes} bytes]"
"""Ends a raw body cut to `RAW_LIMIT_BYTES`, saying how long the whole body was."""

TABLE_NAME: Final = "actonce_dead_letters"
"""The SQL table dead letters are kept in."""


class DeadLetter(BaseModel):
    """One job the pool gave up on: a dead run, or a message that could not be parsed.

    Text is kept printable in every store: a NUL is written `\\x00`, and bytes that are not UTF-8
    are written as backslash escapes. Timestamps must be timezone-aware and are kept in UTC.
    """

    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1)
    """The letter's id, derived: `run_letter_id` for a run, `raw_letter_id` for a raw message."""

    tenant_id: str | None = None
    """The run's tenant; `None` for a message that never said."""

    workspace_id: str | None = None
    """The run's workspace; `None` for a message that never said."""

    run_id: str | None = None
    """The run's id (`fir_…`); `None` for a malformed message."""

    rule: str | None = None
    """The name of the run's rule, if known."""

    reason: str = Field(min_length=1)
    """Why, for machines: a snake_case code such as `forbidden`, `not_allowed`,
    `attempts_exhausted` or `malformed_message`."""

    error: str
    """Why, for people: the failure's message."""

    attempts: int = Field(default=0, ge=0)
    """How many attempts reflexr had made of the run; 0 for a malformed message."""

    task_id: str | None = None
    """The Celery task id of the message that dead-lettered it, if it had one."""

    queue: str | None = None
    """The queue the message came from, if known."""

    raw: str | None = Field(default=None, repr=False)
    """A malformed message's body, cut to `RAW_LIMIT_BYTES` with `RAW_TRUNCATED_MARKER` at its
    end when it was longer; `None` for a dead run. Left out of the letter's repr, so logs stay
    small."""

    dead_at: AwareDatetime
    """When it was dead-lettered, in UTC."""

    replayed_at: AwareDatetime | None = None
    """When an operator last replayed it, in UTC; `None` if never."""

    replays: int = Field(default=0, ge=0)
    """How many times it was replayed."""

    @classmethod
    def malformed(
        cls,
        body: bytes | str,
        *,
        error: str,
        dead_at: datetime,
        task_id: str | None = None,
        queue: str | None = None,
        reason: str = MALFORMED_MESSAGE,
    ) -> Self:
        """Return the letter for a message that could not be parsed, keeping its raw body.

        Args:
            body: The message's body as it arrived.
            error: Why it was refused, for people (a validation error's summary).
            dead_at: When, timezone-aware.
            task_id: The Celery task id, if the message had one.
            queue: The queue it came from, if known.
            reason: Why, as a code: `malformed_message`, or `unknown_run` for a well-formed
                message naming no run.

        Returns:
            A letter with that reason, the id `raw_letter_id(task_id, body)`
            and the body as `raw_text` gives it.

        Raises:
            pydantic.ValidationError: If `dead_at` is naive.
        """
        return cls(
            id=raw_letter_id(task_id, body),
            reason=reason,
            error=error,
            task_id=task_id,
            queue=queue,
            raw=raw_text(body),
            dead_at=dead_at,
        )

    @field_validator("dead_at", "replayed_at")
    @classmethod
    def _in_utc(cls, at: datetime | None) -> datetime | None:
        return None if at is None else at.astimezone(UTC)

    @field_validator(
        "tenant_id", "workspace_id", "run_id", "rule", "reason", "error", "task_id", "queue"
    )
    @classmethod
    def _printable_text(cls, text: str | None) -> str | None:
        return None if text is None else _printable(text)

    @field_validator("raw")
    @classmethod
    def _bounded_text(cls, text: str | None) -> str | None:
        return None if text is None else _bounded(_printable(text))


def run_letter_id(tenant_id: str, workspace_id: str, run_id: str, epoch: int) -> str:
    """Return the id of a run's dead letter: the same for every delivery of the same attempt.

    A duplicate delivery of the attempt that dead-lettered the run makes the same id, so the store
    keeps one letter; a later attempt (a replayed run that died again) has another epoch and
    makes another letter.

    Args:
        tenant_id: The run's tenant.
        workspace_id: The run's workspace.
        run_id: The run's id (`fir_…`).
        epoch: The run's epoch in the attempt that dead-lettered it.

    Returns:
        `dl_` and the first 16 hex characters of the SHA-256 of the four parts joined by NULs.
    """
    seed = "\x00".join((tenant_id, workspace_id, run_id, str(epoch)))
    return f"{DEAD_LETTER}{hashlib.sha256(seed.encode()).hexdigest()[:DIGEST_LENGTH]}"


def raw_letter_id(task_id: str | None, body: bytes | str) -> str:
    """Return the id of a malformed message's dead letter: the same for every redelivery of it.

    Args:
        task_id: The message's Celery task id, or `None` if it had none (then two messages with
            the same body share a letter).
        body: The message's body as it arrived; a `str` counts as its UTF-8 bytes.

    Returns:
        `dl_` and the first 16 hex characters of the SHA-256 of the task id (or "") and the
        body's SHA-256 hex digest, joined by a NUL.
    """
    body_digest = hashlib.sha256(_as_bytes(body)).hexdigest()
    seed = f"{task_id or ''}\x00{body_digest}"
    return f"{DEAD_LETTER}{hashlib.sha256(seed.encode()).hexdigest()[:DIGEST_LENGTH]}"


def raw_text(body: bytes | str) -> str:
    """Return a message's body as a letter keeps it: printable text of at most the bound.

    Bytes that are not UTF-8 and NULs become backslash escapes; a body longer than
    `RAW_LIMIT_BYTES` is cut there and ends with `RAW_TRUNCATED_MARKER`, which tells its length.
    """
    text = body.decode("utf-8", "backslashreplace") if isinstance(body, bytes) else body
    return _bounded(_printable(text), total_bytes=len(_as_bytes(body)))


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
    (asyncpg); any `AsyncEngine` will do. The table must exist: `create_dead_letter_table` makes
    it, from the `migrate` step.

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


async def create_dead_letter_table(engine: AsyncEngine) -> None:
    """Make the table `actonce_dead_letters` and its index, if they are not there yet.

    Idempotent; the `migrate` step calls it, never a worker at start.
    """
    async with engine.begin() as connection:
        await connection.run_sync(
            lambda sync: DEAD_LETTERS_TABLE.metadata.create_all(sync, checkfirst=True)
        )


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


def _as_bytes(body: bytes | str) -> bytes:
    return body if isinstance(body, bytes) else body.encode("utf-8", "surrogatepass")


def _printable(text: str) -> str:
    """Text every store keeps: lone surrogates as backslash escapes, a NUL as `\\x00`."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def _bounded(text: str, *, total_bytes: int | None = None) -> str:
    """Cut text longer than `RAW_LIMIT_BYTES` in UTF-8, ending it with the marker."""
    data = text.encode("utf-8")
    if len(data) <= RAW_LIMIT_BYTES:
        return text
    marker = RAW_TRUNCATED_MARKER.format(total_bytes=total_bytes or len(data))
    kept = data[: RAW_LIMIT_BYTES - len(marker.encode("utf-8"))]
    return kept.decode("utf-8", "ignore") + marker
