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
other queues (Celery's control and reply queues) pass untouched.
"""

import functools
import logging
from collections.abc import Callable
from typing import Any, Final, cast

from kombu.transport import redis as kombu_redis
from kombu.utils.json import register_type

log = logging.getLogger("actonce.intake")

type Screen = Callable[[str, bytes], bool]
"""Decides one popped message: given its queue and raw bytes, returns whether to deliver it
(having kept the dead letter of one it refuses)."""

type Requeue = Callable[[str, bytes], None]
"""Puts a popped message back at the far end of its Redis list, named by key."""


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


class GuardedTransport(kombu_redis.Transport):
    """kombu's Redis transport with `GuardedChannel`; `guarded` returns a configured subclass."""

    Channel = GuardedChannel

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
            if command_name == _SCREENED and reply:
                return self._actonce_intake(reply)
            return reply

    _CLIENT_CLASSES[base] = GuardedRedis
    return GuardedRedis


def _intake(channel: GuardedChannel, transport: GuardedTransport, reply: Any) -> Any:
    """Return the BRPOP reply to deliver it, or `None` (a timeout to kombu) to drop it."""
    key, item = reply
    key_text = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
    # A priority queue's list is `<queue><sep><priority>`; kombu strips it the same way.
    queue = key_text.rsplit(channel.sep, 1)[0]
    screen = transport.screen
    if queue not in transport.guarded_queues or screen is None:
        return reply
    data = item if isinstance(item, bytes) else str(item).encode("utf-8", "surrogatepass")
    try:
        deliver = screen(queue, data)
    except Exception:
        # The letter could not be kept (the database is away): the message goes back to the far
        # end of its list, to be screened again after the rest, rather than be lost.
        log.exception("could not dead-letter a refused message from %s; requeued it", queue)
        with channel.conn_or_acquire() as client:
            client.lpush(key, item)
        return None
    return reply if deliver else None
