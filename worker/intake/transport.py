"""Where the intake check runs: on the Redis reply that pops a message, before kombu reads it.

Why this seam, read off Celery 5.7 and kombu 5.6: a worker takes a message off a queue in exactly
one place, the Redis channel's BRPOP (`Channel._brpop_read`, used by the event loop and by
`drain_events` without one). Everything after that can fail on a hostile message in the main
process, where Celery does not expect it:

- `_brpop_read` itself: `loads(bytes_to_str(item))` raises on bytes that are not UTF-8 JSON;
- the transport's `Message(...)`: a `KeyError` for an envelope without `properties` or
  `delivery_tag`, a `TypeError` for one that is not an object, a base64 error for a bad body,
  and `decompress` of whatever a `compression` header names, unbounded;
- `QoS.append` (the `unacked` hash): a `KeyError` without `delivery_info`;
- Celery's `on_task_received`, its strategy and `Request`: `headers['task']` of any type used as
  a key, a missing `headers.id`, a body that is not `[args, kwargs, embed]` or a content type no
  serializer knows, an `eta` held in memory however far ahead.

The consumer's hooks (`on_decode_error`, `on_unknown_message`, `on_invalid_task`, strategies)
come after some of these, and a kombu message callback after all of them; an exception there
tears the consumer down, and one after `QoS.append` leaves the message in `unacked`, to kill the
next worker too. So the check runs on the BRPOP reply itself: `GuardedChannel` builds its Redis
client from a subclass whose `parse_response` hands every BRPOP reply from one of actonce's
queues to `screen`. An accepted message goes on unchanged; a refused one is kept as a dead
letter (`keep`) and the reply becomes `None`, which kombu reads exactly as a BRPOP that timed
out: nothing is delivered, nothing enters `unacked`, and the next BRPOP is sent. The worker's
other queues (Celery's control and reply queues) pass untouched. On Redis Sentinel the same
screen sits on kombu's sentinel channel (`GuardedSentinelChannel`), whose client reaches the
master the sentinels name.

A refused message whose letter cannot be kept (the database is away) is not lost and does not
spin. Put straight back on its list, it was popped again at once, and every pop tried the store
and logged a traceback, for as long as the database was away. It is held instead in the sorted
set `HELD_KEY`, in Redis, scored by when it may be screened again (the screen says when, raising
`NotKept`), and the queue's other messages are served meanwhile. Every `RELEASE_EVERY_S`, on the
reply of one of its BRPOPs (one arrives at least every `brpop_timeout`, a second, when the queue
is idle), each consumer moves the held messages that are due back to the far end of their lists,
in one Lua script, so each goes back once however many workers look; one a worker held before it
died is released by any other.
"""

import functools
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any, Final, cast

from kombu.transport import redis as kombu_redis
from kombu.utils.json import register_type

log = logging.getLogger("actonce.intake")

type Screen = Callable[[str, bytes], bool]
"""Decides one popped message: given its queue and raw bytes, returns whether to deliver it
(having kept the dead letter of one it refuses)."""

HELD_KEY: Final = "actonce:intake:held"
"""The Redis sorted set of refused messages whose letters could not be kept yet: each member is
the message's list key, a nonce and its bytes, scored by the time (Unix seconds) it goes back."""

RELEASE_EVERY_S: Final = 1.0
"""How often a consumer moves the held messages that are due back to their lists, at most."""

FAULT_HOLD_S: Final = 30.0
"""How long a message is held when the screen failed other than with `NotKept`: a fault of the
screen itself, which a retry at once would meet again."""


class NotKept(Exception):
    """Raised by a screen that refused a message but could not keep its letter.

    The message is held in `HELD_KEY` for `retry_in_s` seconds, then goes back to its list and
    is screened again.
    """

    def __init__(self, retry_in_s: float, why: str) -> None:
        super().__init__(why)
        self.retry_in_s = retry_in_s


class GuardedChannel(kombu_redis.Channel):
    """kombu's Redis channel, whose BRPOP replies from `guarded_queues` pass `screen` first."""

    def _get_client(self) -> Any:
        base: Any = super()._get_client()  # type: ignore[no-untyped-call]
        factory: Any = base.func if isinstance(base, functools.partial) else base
        bound: dict[str, Any] = base.keywords if isinstance(base, functools.partial) else {}
        transport: GuardedTransport = self.connection
        intake = functools.partial(_intake, self, transport)
        client_class: Callable[..., Any] = _guarded_client(factory)
        return functools.partial(client_class, **bound, intake=intake)


class GuardedSentinelChannel(GuardedChannel, kombu_redis.SentinelChannel):
    """The guarded channel on Redis Sentinel: kombu's sentinel channel, whose pool reaches the
    master the sentinels name, with BRPOP replies screened as on a plain Redis."""


class GuardedTransport(kombu_redis.Transport):
    """kombu's Redis transport with `GuardedChannel`, or `GuardedSentinelChannel` when the
    connection names a sentinel master; `guarded` returns a configured subclass."""

    Channel: type[GuardedChannel] = GuardedChannel

    def __init__(self, client: Any, *args: Any, **kwargs: Any) -> None:
        # The settings give a master name with a sentinel:// URL only, and kombu's sentinel
        # channel needs one: it is what says the URL names sentinels.
        if client.transport_options.get("master_name"):
            self.Channel = GuardedSentinelChannel
            self.default_port = kombu_redis.SentinelTransport.default_port
            # On a connection error kombu switches to the URL's next part, and a switch takes
            # the transport its scheme names: kombu's own sentinel transport, with no screen.
            # The channel asks every sentinel for the master anyway, so there is nothing to
            # switch to.
            client.cycle = None
        super().__init__(client, *args, **kwargs)  # type: ignore[no-untyped-call]

    guarded_queues: frozenset[str] = frozenset()
    """The queues whose messages are screened."""

    screen: Screen | None = None
    """What decides each message of those queues."""


def guarded(queues: frozenset[str], screen: Screen) -> type[GuardedTransport]:
    """Return a Redis transport class whose channels screen the messages of `queues`."""
    made = _NamedRedis(
        "ActonceGuardedTransport",
        (GuardedTransport,),
        {"guarded_queues": queues, "screen": staticmethod(screen)},
    )
    return cast(type[GuardedTransport], made)


class _NamedRedis(type):
    """Names a guarded transport class `redis` where kombu prints it: the worker's banner and
    its connection errors show `redis://host:port/db`, as for kombu's own Redis transport."""

    def __str__(cls) -> str:
        return "redis"


# `celery inspect stats` (and so Flower's workers) reports the consumer's connection, which names
# its transport class: JSON has no class, so it is written as its name, `redis`.
register_type(_NamedRedis, None, str)


# ─── how ──────────────────────────────────────────────────────────────────────


_SCREENED: Final = "BRPOP"
"""The one Redis command whose replies carry a consumed message."""


_CLIENT_CLASSES: Final[dict[Any, type[Any]]] = {}
"""The guarded subclass made of each Redis client class, made once."""


def _guarded_client(base: Any) -> type[Any]:
    """Return a subclass of the Redis client class `base` whose BRPOP replies are screened."""
    made = _CLIENT_CLASSES.get(base)
    if made is not None:
        return made

    class GuardedRedis(base):  # type: ignore[misc]
        def __init__(self, *args: Any, intake: Callable[[Any], Any], **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._actonce_intake = intake

        def parse_response(self, connection: Any, command_name: Any, **options: Any) -> Any:
            reply = super().parse_response(connection, command_name, **options)
            if command_name == _SCREENED:
                # Every reply, a timeout's `None` too: an idle queue still releases held messages.
                return self._actonce_intake(reply)
            return reply

    _CLIENT_CLASSES[base] = GuardedRedis
    return GuardedRedis


def _intake(channel: GuardedChannel, transport: GuardedTransport, reply: Any) -> Any:
    """Return the BRPOP reply to deliver it, or `None` (a timeout to kombu) to drop it; release
    the held messages that are due, at most every `RELEASE_EVERY_S`."""
    if time.monotonic() >= _release.next_at:
        _release.next_at = time.monotonic() + RELEASE_EVERY_S
        _release_due(channel)
    if not reply:
        return reply
    key, item = reply
    key_text = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
    # A priority queue's list is `<queue><sep><priority>`; kombu strips it the same way.
    queue = key_text.rsplit(channel.sep, 1)[0]
    screen = transport.screen
    if queue not in transport.guarded_queues or screen is None:
        return reply
    data = item if isinstance(item, bytes) else str(item).encode("utf-8", "surrogatepass")
    list_key = key if isinstance(key, bytes) else key_text.encode()
    try:
        deliver = screen(queue, data)
    except NotKept as not_kept:
        # The screen logged why; held in Redis, the message is neither lost nor popped in a loop.
        _hold(channel, list_key, data, not_kept.retry_in_s)
        return None
    except Exception:
        log.exception(
            "the intake failed on a message from %s; it is held %.0fs, then screened again",
            queue,
            FAULT_HOLD_S,
        )
        _hold(channel, list_key, data, FAULT_HOLD_S)
        return None
    return reply if deliver else None


class _Release:
    """When this process next looks for held messages that are due (monotonic seconds)."""

    next_at: float = 0.0


_release: Final = _Release()


def _hold(channel: GuardedChannel, key: bytes, item: bytes, retry_in_s: float) -> None:
    """Hold a popped message in `HELD_KEY` until `retry_in_s` from now; it then goes back to the
    far end of the list `key`."""
    member = b"\n".join([key, secrets.token_hex(8).encode(), item])
    with channel.conn_or_acquire() as client:
        client.zadd(HELD_KEY, {member: time.time() + retry_in_s})
    # Looked for when it is due, not only at the next round.
    _release.next_at = min(_release.next_at, time.monotonic() + retry_in_s)


_RELEASE_SCRIPT: Final = r"""
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local key_end = string.find(member, '\n', 1, true)
  local nonce_end = string.find(member, '\n', key_end + 1, true)
  redis.call('LPUSH', string.sub(member, 1, key_end - 1), string.sub(member, nonce_end + 1))
  redis.call('ZREM', KEYS[1], member)
end
return #due
"""
"""Moves the held messages due by ARGV[1] (at most ARGV[2]) back to the far end of their lists
and forgets them, in one step: of workers releasing at once, one moves each."""

_RELEASE_BATCH: Final = 100
"""The most held messages one release moves back: the rest go at the next."""


def _release_due(channel: GuardedChannel) -> None:
    """Move the held messages that are due back to their lists. A failure (a Redis that refuses
    scripts) is logged and tried again `FAULT_HOLD_S` later: the messages stay held, none lost."""
    try:
        with channel.conn_or_acquire() as client:
            moved = client.eval(_RELEASE_SCRIPT, 1, HELD_KEY, time.time(), _RELEASE_BATCH)
    except Exception as error:
        _release.next_at = time.monotonic() + FAULT_HOLD_S
        log.warning(
            "could not release the held refused messages (%r); trying again in %.0fs",
            error,
            FAULT_HOLD_S,
        )
        return
    if moved:
        log.info("released %d held refused message(s) to be screened again", moved)
