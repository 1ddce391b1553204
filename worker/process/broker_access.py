"""Whether the broker lets actonce in (its user, password and database): checked once, at start.

redis-py raises a refused login as a kind of lost connection, and Celery retries a lost
connection `ACTONCE_BROKER_MAX_RETRIES` times, 2 to 30 s apart: a worker started with a wrong
password, or a database number the server does not have, logged the same line through every one
of those retries before its supervisor heard of it. No retry mends either, so a worker or
dispatcher whose broker refuses the connection's own handshake (`AUTH`, `SELECT`) at start
refuses to start, naming the variable to fix. A broker that does not answer at all is left to the
retries: it may be starting, and they are for that. `reach` makes that one connection;
`actonce dead replay` uses it too, to send nothing unless the broker takes its message.

`broker_client` is the one way actonce's own code (the dispatcher's marks and heartbeat, its
metrics, `actonce status`, this check) opens a client of the broker's Redis: on a `sentinel://`
URL, a client of the master the sentinels name, which follows a failover without a restart
(`worker.process.sentinels`). Celery and kombu reach it through their own sentinel transport.
"""

from dataclasses import dataclass
from typing import Any, Final

import redis
from redis.exceptions import AuthenticationError, RedisError, ResponseError

from actonce.worker.process import sentinels
from actonce.worker.process.health import reason
from actonce.worker.settings import Settings, mask_url

BROKER_VARIABLE: Final = "ACTONCE_BROKER_URL (or REDIS_URL)"
"""Where the broker's URL is set: what a refusal tells the operator to fix."""

CHECK_TIMEOUT_S: Final = 5.0
"""How long the start-up check waits for the broker to answer; one that does not is left to
Celery."""


class BrokerRefused(RuntimeError):
    """Raised at start when the broker, or a Redis result backend, refuses actonce's connection;
    the message is one line, the password masked."""


@dataclass(frozen=True)
class Unreached:
    """Why a Redis could not be used: it refused the connection, or did not answer."""

    refused: bool
    """Whether it answered and refused the handshake (user, password, database): no retry
    mends that."""

    why: str
    """The error's type and first line."""


def broker_client(settings: Settings, *, url: str | None = None, **options: Any) -> redis.Redis:
    """Return a client of the broker's Redis, or of the Redis at `url` (a result backend).

    On a `sentinel://` URL the client reaches the master the sentinels name
    `ACTONCE_BROKER_MASTER_NAME`, asked again at each new connection: after a failover, the
    command that met the old master's loss fails (or is retried by redis-py) and the next
    reaches the new master. `options` are redis-py's connection options (timeouts, `retry`).
    """
    where = settings.broker_url if url is None else url
    if not sentinels.is_sentinel(where):
        return redis.Redis.from_url(where, **options)
    password = settings.broker_sentinel_password
    return sentinels.master_client(
        where,
        settings.broker_master_name or "",
        password.get_secret_value() if password is not None else None,
        **options,
    )


def check_broker_access(settings: Settings) -> None:
    """Connect to the broker, and to the result backend when it is another Redis, as Celery will.

    Raises:
        BrokerRefused: If either refused the user or password (wrong, missing, or a
            disabled user) or the database number.
    """
    where = {settings.broker_url: BROKER_VARIABLE}
    if settings.results_url not in where and settings.results_url.startswith(
        ("redis://", "rediss://", "unix://", f"{sentinels.SCHEME}://")
    ):
        where[settings.results_url] = "ACTONCE_RESULT_BACKEND_URL"
    for url, variable in where.items():
        unreached = reach(settings, url=url, timeout_s=CHECK_TIMEOUT_S)
        if unreached is not None and unreached.refused:
            raise BrokerRefused(
                f"the Redis at {mask_url(url)} refused actonce's connection ({unreached.why}): "
                f"{fix_refusal(variable)}"
            )


def fix_refusal(variable: str) -> str:
    """What to do about a Redis that refused the handshake, whose URL `variable` sets."""
    return f"set a user, password and database it knows in {variable}"


def reach(settings: Settings, *, timeout_s: float, url: str | None = None) -> Unreached | None:
    """Make one connection to the broker's Redis (or the one at `url`), its handshake alone
    (`AUTH`, `SELECT`), within `timeout_s` and without retrying; return why it failed, or None
    if it was made.

    No command is sent: a user need not be allowed `PING`. On sentinels, the master they name
    is the one reached; sentinels that do not answer, or know no such master, count as not
    answering.
    """
    client = broker_client(
        settings, url=url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s, retry=None
    )
    pool = client.connection_pool
    try:
        pool.release(pool.get_connection())
    except (AuthenticationError, ResponseError) as refused:
        return Unreached(refused=True, why=reason(refused))
    except (RedisError, OSError) as away:
        return Unreached(refused=False, why=reason(away))
    finally:
        client.close()
    return None
