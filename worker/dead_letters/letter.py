"""A dead letter: the record of one job the pool gave up on, and how its id is derived.

A run reflexr dead-lettered (a permanent `RunFailure`, or its attempts ran out) is kept with its
reason code, and so is a message that could not even be parsed, with its raw body and why it was
refused. A letter's id is derived: a duplicate delivery of the same attempt dead-letters the run
under the same id, so the store (`worker.dead_letters.store`) keeps one letter and the duplicate is
harmless.
"""

import base64
import hashlib
from datetime import UTC, datetime
from typing import Final, Literal, Self

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from actonce.tasks.lifecycle import Reason
from actonce.tasks.observers import Letter

DEAD_LETTER: Final = "dl_"
"""The prefix of a dead letter's id."""

DIGEST_LENGTH: Final = 16
"""How many hex characters of the SHA-256 a dead letter's id keeps."""


RAW_LIMIT_BYTES: Final = 64 * 1024
"""The most UTF-8 bytes of a malformed message's body a letter keeps, the marker included."""

RAW_TRUNCATED_MARKER: Final = "\n[... truncated by actonce: the body had {total_bytes} bytes]"
"""Ends a raw body cut to `RAW_LIMIT_BYTES`, saying how long the whole body was."""

INTAKE_DIGEST_LENGTH: Final = 32
"""How many hex characters of the SHA-256 of a refused message's bytes its letter's id keeps:
128 bits, so two different messages never share a letter."""


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
    end when it was longer; `None` for a dead run. A message refused at intake keeps its whole
    envelope as it lay in Redis (headers and properties included), as `raw_encoding` says. Left
    out of the letter's repr, so logs stay small."""

    raw_encoding: Literal["text", "base64"] | None = None
    """How `raw` holds a message refused at intake: `text` (its bytes were UTF-8 with no NUL,
    kept as they were) or `base64` (of its bytes, cut to whole bytes under the bound, no
    marker); `None` for other letters, whose `raw` is printable text."""

    raw_bytes: int | None = Field(default=None, ge=0)
    """How many bytes the refused message had, whole; `raw` may hold fewer. `None` for other
    letters."""

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
        reason: str = Reason.MALFORMED_MESSAGE,
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

    @classmethod
    def refused(
        cls,
        item: bytes,
        *,
        reason: str,
        error: str,
        dead_at: datetime,
        task_id: str | None = None,
        queue: str | None = None,
    ) -> Self:
        """Return the letter of a message refused at intake, keeping its bytes exactly.

        Args:
            item: The message's bytes as they lay in Redis: kombu's envelope, headers and all.
            error: Why it was refused, for people.
            dead_at: When, timezone-aware.
            task_id: Its `headers.id`, if that was a valid id.
            queue: The queue it was read from.
            reason: The intake's reason code (`malformed_message`, `unknown_task`, ...).

        Returns:
            A letter with the id `intake_letter_id(item)`, `raw` the bytes as text when they are
            UTF-8 with no NUL, else as base64, and `raw_bytes` their length.
        """
        try:
            text = item.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and "\x00" not in text:
            raw, encoding = raw_text(item), "text"
        else:
            # Whole bytes whose base64 fits the bound: no marker, `raw_bytes` tells the rest.
            raw, encoding = base64.b64encode(item[: RAW_LIMIT_BYTES // 4 * 3]).decode(), "base64"
        return cls(
            id=intake_letter_id(item),
            reason=reason,
            error=error,
            task_id=task_id,
            queue=queue,
            raw=raw,
            raw_encoding=encoding,
            raw_bytes=len(item),
            dead_at=dead_at,
        )

    def raw_message(self) -> bytes | None:
        """Return the refused message's bytes as kept (maybe cut), or `None` if there are none.

        A `text` raw is returned as its UTF-8 bytes, a `base64` one decoded; a letter not made
        at intake returns its printable `raw` as UTF-8.
        """
        if self.raw is None:
            return None
        if self.raw_encoding == "base64":
            return base64.b64decode(self.raw)
        return self.raw.encode("utf-8")

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


def letter_id(*parts: str) -> str:
    """Return a derived letter id: `dl_` and 16 hex characters of the SHA-256 of `parts` joined
    by NULs. The same parts make the same id, so a repeated dead-lettering keeps one letter."""
    seed = "\x00".join(parts)
    return f"{DEAD_LETTER}{hashlib.sha256(seed.encode()).hexdigest()[:DIGEST_LENGTH]}"


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
    return letter_id(tenant_id, workspace_id, run_id, str(epoch))


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
    return letter_id(task_id or "", body_digest)


def intake_letter_id(item: bytes) -> str:
    """Return the id of the letter of a message refused at intake: its bytes' digest.

    Two different messages never share it (128 bits of SHA-256); the same bytes read twice
    make the same id, so the store keeps one letter.

    Returns:
        `dl_` and the first 32 hex characters of the SHA-256 of `intake\\x00` and the bytes.
    """
    digest = hashlib.sha256(b"intake\x00" + item).hexdigest()
    return f"{DEAD_LETTER}{digest[:INTAKE_DIGEST_LENGTH]}"


def raw_text(body: bytes | str) -> str:
    """Return a message's body as a letter keeps it: printable text of at most the bound.

    Bytes that are not UTF-8 and NULs become backslash escapes; a body longer than
    `RAW_LIMIT_BYTES` is cut there and ends with `RAW_TRUNCATED_MARKER`, which tells its length.
    """
    text = body.decode("utf-8", "backslashreplace") if isinstance(body, bytes) else body
    return _bounded(_printable(text), total_bytes=len(_as_bytes(body)))


# ─── how ──────────────────────────────────────────────────────────────────────


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


def seen(letter: DeadLetter, *, message_id: str | None = None) -> Letter:
    """Return what the lifecycle's observers are told of `letter`: its ids, never its text."""
    return Letter(
        id=letter.id,
        reason=letter.reason,
        tenant_id=letter.tenant_id,
        workspace_id=letter.workspace_id,
        run_id=letter.run_id,
        message_id=message_id,
        rule=letter.rule,
        attempts=letter.attempts,
    )
