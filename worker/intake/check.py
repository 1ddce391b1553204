"""The intake check: whether a message read off one of actonce's queues may reach Celery at all.

Anything with the broker's password can write to `actonce.attempts` and `actonce.turns`: an old
client, another Celery app sharing the Redis, a half-written message, an attacker. `screen` reads
the message exactly as kombu's Redis transport stored it (the JSON envelope
`{"body", "content-encoding", "content-type", "headers", "properties"}`, the body base64) and
either accepts it or returns a `Refusal` with a reason code, before kombu or Celery decode a
byte of it. Accepted means Celery can decode it without raising in the worker's main process and
it names actonce's own task for that queue; the task still validates its arguments' schema
itself (and dead-letters what does not fit, failing the task).

An `eta` further ahead than any retry actonce makes (`ACTONCE_MAX_RETRY_DELAY_S`, plus the
lease and `ETA_GRACE_S`) is refused as `eta_out_of_range`, dead-lettered rather than dropped with
a log line: Celery would hold it unacked in the main process's memory until then, and a letter
shows who sent it. Nothing is lost by refusing it: a run it named stays pending or retrying in
reflexr, and the dispatcher's sweep sends it when it is due.

It never unpickles, unyamls or decompresses: a body that is not UTF-8 JSON, or carries a
`compression` header, is refused as `unsupported_content`. The size bound is the envelope's
bytes as they lay in Redis, checked before anything is parsed.
"""

import base64
import binascii
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Self

from actonce.tasks.attempt import ATTEMPT_TASK
from actonce.tasks.lifecycle import Reason
from actonce.tasks.turn_task import TURN_TASK
from actonce.worker.settings import ATTEMPTS_QUEUE, TURNS_QUEUE, Settings

ACCEPTED_TASKS: Final[dict[str, frozenset[str]]] = {
    ATTEMPTS_QUEUE: frozenset({ATTEMPT_TASK}),
    TURNS_QUEUE: frozenset({TURN_TASK}),
}
"""The task names each of actonce's queues serves; nothing else runs from them, Celery's
built-in tasks (`celery.accumulate`, `celery.chord_unlock`...) included."""

ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,199}")
"""What an id may be: 1 to 200 ASCII letters, digits and `_.:@-`, starting with a letter or digit.
Celery's task ids (UUIDs) and actonce's ids (`t_…`, `ws_…`, `fir_…`, `msg_…`) fit it; a NUL, a
control character, a space or a slash does not, so no store ever sees one."""

ETA_GRACE_S: Final = 60.0
"""How far beyond the longest retry delay an `eta` may still lie: the worker-lost retry's delay
(the lease plus a second) and clock skew between the machine that sent it and this one."""

ID_ARGUMENTS: Final[dict[str, tuple[str, ...]]] = {
    ATTEMPT_TASK: ("tenant_id", "workspace_id", "run_id"),
    TURN_TASK: ("tenant_id", "workspace_id", "message_id"),
}
"""The arguments of each task that are ids, in their positional order."""

_EMBED_KEYS: Final = frozenset({"callbacks", "errbacks", "chain", "chord"})
"""The keys of a protocol-2 body's third part; actonce's tasks take none of them set."""


@dataclass(frozen=True)
class Refusal:
    """Why a message was refused: a reason code, a sentence for people, and its task id."""

    reason: str
    """One of the reason codes of this module, such as `malformed_message`."""

    error: str
    """What was wrong, naming the field; never the message's content beyond a type or a size."""

    task_id: str | None
    """The message's `headers.id`, when it had one that is a valid id; else `None`."""


@dataclass(frozen=True)
class IntakePolicy:
    """The bounds `screen` applies: the largest message and the furthest `eta`."""

    max_message_bytes: int
    """The most bytes a message may have in Redis, envelope and base64 body included."""

    max_eta_s: float
    """How far ahead of now an `eta` may lie, in seconds."""

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        """Return the policy of these settings: `ACTONCE_MAX_MESSAGE_BYTES`, and
        `ACTONCE_MAX_RETRY_DELAY_S` plus the lease and `ETA_GRACE_S`."""
        return cls(
            max_message_bytes=settings.max_message_bytes,
            max_eta_s=settings.max_retry_delay_s + settings.lease_ttl_s + ETA_GRACE_S,
        )


def screen(item: bytes, queue: str, policy: IntakePolicy, now: datetime) -> Refusal | None:
    """Return why the message `item`, read off `queue`, is refused, or `None` to accept it.

    Args:
        item: The message exactly as Redis returned it: kombu's JSON envelope, as bytes.
        queue: The actonce queue it was read from (`actonce.attempts` or `actonce.turns`).
        policy: The bounds to apply.
        now: The current time, timezone-aware.

    Returns:
        `None` when Celery may decode and run it; else the `Refusal`, whose `task_id` is set
        when the message had a valid `headers.id`.
    """
    found = _Found()
    try:
        _check(item, queue, policy, now, found)
    except _Refused as refused:
        return Refusal(refused.reason, refused.error, found.task_id)
    return None


def arguments_of(item: bytes, max_bytes: int) -> dict[str, Any] | None:
    """Return the keyword arguments of the message `item`, as kombu's Redis transport stored
    it, or `None` if it is larger than `max_bytes` or no envelope and body `screen` would read.

    It reads; it checks nothing else `screen` checks: what it returns may name any task.
    """
    if len(item) > max_bytes:
        return None
    try:
        envelope = _object(_json(item, "the envelope"), "the envelope")
        _, kwargs = _body(envelope.get("body"))
    except _Refused:
        return None
    return kwargs


def is_id(value: object) -> bool:
    """Return whether `value` is a string that `ID_PATTERN` accepts whole."""
    return isinstance(value, str) and ID_PATTERN.fullmatch(value) is not None


# ─── how ──────────────────────────────────────────────────────────────────────


class _Refused(Exception):
    def __init__(self, reason: str, error: str) -> None:
        super().__init__(error)
        self.reason = reason
        self.error = error


@dataclass
class _Found:
    task_id: str | None = None


def _check(item: bytes, queue: str, policy: IntakePolicy, now: datetime, found: _Found) -> None:
    if len(item) > policy.max_message_bytes:
        raise _Refused(
            Reason.OVERSIZED, f"oversized: {len(item)} bytes in Redis > {policy.max_message_bytes}"
        )
    envelope = _object(_json(item, "the envelope"), "the envelope")
    headers = _object(envelope.get("headers"), "headers")
    _task_id(headers, found)
    task = headers.get("task")
    if not isinstance(task, str):
        raise _Refused(Reason.MALFORMED_MESSAGE, f"headers.task is {_kind(task)}, not a task name")
    if task not in ACCEPTED_TASKS.get(queue, frozenset()):
        raise _Refused(Reason.UNKNOWN_TASK, f"task {_shown(task)} is not served on {queue}")
    _properties(envelope.get("properties"), queue)
    _content(envelope, headers)
    args, kwargs = _body(envelope.get("body"))
    _headers(headers)
    _argument_ids(task, args, kwargs)
    _eta(headers.get("eta"), policy, now)


def _json(data: bytes, what: str) -> object:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _Refused(Reason.MALFORMED_MESSAGE, f"{what} is not UTF-8") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise _Refused(Reason.MALFORMED_MESSAGE, f"{what} is not JSON") from None


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Refused(Reason.MALFORMED_MESSAGE, f"{what} is {_kind(value)}, not a JSON object")
    return value


def _task_id(headers: dict[str, Any], found: _Found) -> None:
    task_id = headers.get("id")
    if task_id is None:
        raise _Refused(Reason.MALFORMED_MESSAGE, "headers.id is missing")
    if not isinstance(task_id, str):
        raise _Refused(Reason.MALFORMED_MESSAGE, f"headers.id is {_kind(task_id)}, not a string")
    if not is_id(task_id):
        raise _Refused(Reason.INVALID_ID, f"headers.id is no id: {_described(task_id)}")
    found.task_id = task_id


def _properties(value: object, queue: str) -> None:
    properties = _object(value, "properties")
    tag = properties.get("delivery_tag")
    if not isinstance(tag, str) or not 0 < len(tag) <= 200:
        raise _Refused(Reason.MALFORMED_MESSAGE, "properties.delivery_tag is not a string of 1-200")
    if properties.get("body_encoding") != "base64":
        raise _Refused(Reason.MALFORMED_MESSAGE, "properties.body_encoding is not base64")
    delivery = _object(properties.get("delivery_info"), "properties.delivery_info")
    if not isinstance(delivery.get("exchange"), str):
        raise _Refused(
            Reason.MALFORMED_MESSAGE, "properties.delivery_info.exchange is not a string"
        )
    if delivery.get("routing_key") != queue:
        raise _Refused(
            Reason.MALFORMED_MESSAGE, f"properties.delivery_info.routing_key is not {queue}"
        )
    priority = properties.get("priority")
    if priority is not None and not (_is_int(priority) and 0 <= priority <= 255):
        raise _Refused(Reason.MALFORMED_MESSAGE, "properties.priority is not an integer 0-255")


def _content(envelope: dict[str, Any], headers: dict[str, Any]) -> None:
    content_type = envelope.get("content-type")
    if content_type != "application/json":
        raise _Refused(
            Reason.UNSUPPORTED_CONTENT,
            f"content-type {_shown(content_type)} is not application/json",
        )
    encoding = envelope.get("content-encoding")
    if not isinstance(encoding, str) or encoding.lower() not in ("utf-8", "utf8"):
        raise _Refused(
            Reason.UNSUPPORTED_CONTENT, f"content-encoding {_shown(encoding)} is not utf-8"
        )
    if headers.get("compression") is not None:
        # Refused, never decompressed: a few KB of zlib can stand for gigabytes.
        raise _Refused(
            Reason.UNSUPPORTED_CONTENT,
            f"compressed body ({_shown(headers['compression'])}) refused",
        )


def _body(value: object) -> tuple[list[Any], dict[str, Any]]:
    if not isinstance(value, str) or not value:
        raise _Refused(Reason.MALFORMED_MESSAGE, f"body is {_kind(value)}, not base64 text")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _Refused(Reason.MALFORMED_MESSAGE, "body is not valid base64") from None
    body = _json(data, "the body")
    if not (isinstance(body, list) and len(body) == 3):
        raise _Refused(Reason.MALFORMED_MESSAGE, "body is not the list [args, kwargs, embed]")
    args, kwargs, embed = body
    if not isinstance(args, list) or not isinstance(kwargs, dict) or not isinstance(embed, dict):
        raise _Refused(Reason.MALFORMED_MESSAGE, "body is not [list, object, object]")
    if set(embed) - _EMBED_KEYS or any(embed.values()):
        raise _Refused(
            Reason.MALFORMED_MESSAGE,
            "body asks for callbacks, errbacks, a chain or a chord: none taken",
        )
    return args, kwargs


def _headers(headers: dict[str, Any]) -> None:
    """Check the headers Celery reads in the main process have the types it expects."""
    for name in ("root_id", "parent_id", "group"):
        value = headers.get(name)
        if value is not None and not isinstance(value, str):
            raise _Refused(Reason.MALFORMED_MESSAGE, f"headers.{name} is {_kind(value)}")
        if value is not None and not is_id(value):
            raise _Refused(Reason.INVALID_ID, f"headers.{name} is no id: {_described(value)}")
    for name in ("argsrepr", "kwargsrepr", "origin", "eta", "expires"):
        value = headers.get(name)
        if value is not None and not isinstance(value, str):
            raise _Refused(
                Reason.MALFORMED_MESSAGE, f"headers.{name} is {_kind(value)}, not a string"
            )
    for name in ("retries", "group_index", "replaced_task_nesting"):
        value = headers.get(name)
        if value is not None and not (_is_int(value) and value >= 0):
            raise _Refused(Reason.MALFORMED_MESSAGE, f"headers.{name} is not a whole number")
    if headers.get("shadow") is not None:
        raise _Refused(
            Reason.MALFORMED_MESSAGE, "headers.shadow is set: actonce's tasks are not renamed"
        )
    if headers.get("lang") not in (None, "py"):
        raise _Refused(Reason.MALFORMED_MESSAGE, "headers.lang is not py")
    ignore_result = headers.get("ignore_result")
    if ignore_result is not None and not isinstance(ignore_result, bool):
        raise _Refused(Reason.MALFORMED_MESSAGE, "headers.ignore_result is not a boolean")
    timelimit = headers.get("timelimit")
    if timelimit is not None and not (
        isinstance(timelimit, list)
        and len(timelimit) == 2
        and all(limit is None or (_is_number(limit) and limit >= 0) for limit in timelimit)
    ):
        raise _Refused(Reason.MALFORMED_MESSAGE, "headers.timelimit is not [soft, hard] in seconds")
    stamped = headers.get("stamped_headers")
    if stamped is not None and not (
        isinstance(stamped, list) and all(isinstance(name, str) for name in stamped)
    ):
        raise _Refused(Reason.MALFORMED_MESSAGE, "headers.stamped_headers is not a list of names")
    stamps = headers.get("stamps")
    if stamps is not None and not isinstance(stamps, dict):
        raise _Refused(Reason.MALFORMED_MESSAGE, "headers.stamps is not an object")
    for name in ("eta", "expires"):
        _when(headers.get(name), name)


def _argument_ids(task: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    """Refuse an id argument that is a string but no id; the task checks the rest's schema."""
    names = ID_ARGUMENTS[task]
    given = {**dict(zip(names, args, strict=False)), **kwargs}
    for name in names:
        value = given.get(name)
        if isinstance(value, str) and not is_id(value):
            raise _Refused(Reason.INVALID_ID, f"{name} is no id: {_described(value)}")


def _eta(value: object, policy: IntakePolicy, now: datetime) -> None:
    eta = _when(value, "eta")
    if eta is None:
        return
    ahead = (eta - now).total_seconds()
    if ahead > policy.max_eta_s:
        raise _Refused(
            Reason.ETA_OUT_OF_RANGE,
            f"eta is {ahead:.0f}s ahead, beyond the {policy.max_eta_s:.0f}s any retry waits; "
            "a run it named is sent again by the dispatcher's sweep when due",
        )


def _when(value: object, name: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _Refused(Reason.MALFORMED_MESSAGE, f"headers.{name} is {_kind(value)}, not a time")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise _Refused(
            Reason.MALFORMED_MESSAGE, f"headers.{name} is not an ISO 8601 time"
        ) from None
    # Celery reads a naive time in the worker's zone; actonce's workers run in UTC.
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kind(value: object) -> str:
    """Name a JSON value's type, never its content."""
    if value is None:
        return "missing or null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    names |= {list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _shown(value: object) -> str:
    """Show a short name-like value as it is, anything else by its kind."""
    if isinstance(value, str) and len(value) <= 80 and value.isprintable():
        return repr(value)
    return _kind(value)


def _described(value: str) -> str:
    """Say what is wrong with an id without echoing a hostile one whole."""
    if not value:
        return "empty"
    if len(value) > 200:
        return f"{len(value)} characters, more than 200"
    bad = sorted({char for char in value if not re.fullmatch(r"[A-Za-z0-9_.:@-]", char)})
    if bad:
        return "has " + ", ".join(repr(char) for char in bad[:5])
    return "does not start with a letter or digit"
