"""Whether the broker lets actonce in (its user, password and database): checked once, at start.

redis-py raises a refused login as a kind of lost connection, and Celery retries a lost
connection `ACTONCE_BROKER_MAX_RETRIES` times, 2 to 30 s apart: a worker started with a wrong
password, or a database number the server does not have, logged the same line for about 45
minutes before its supervisor heard of it. No retry mends either, so a worker or dispatcher
whose broker refuses the connection's own handshake (`AUTH`, `SELECT`) at start refuses to start,
naming the variable to fix. A broker that does not answer at all is left to the retries: it may
be starting, and they are for that.
"""

from typing import Final

import redis
from redis.exceptions import AuthenticationError, RedisError, ResponseError

from actonce.worker.health import reason
from actonce.worker.settings import Settings, mask_url

CHECK_TIMEOUT_S: Final = 5.0
"""How long the check waits for the broker to answer; one that does not is left to Celery."""


class BrokerRefused(RuntimeError):
    """Raised at start when the broker, or a Redis result backend, refuses actonce's connection;
    the message is one line, the password masked."""


def check_broker_access(settings: Settings) -> None:
    """Connect to the broker, and to the result backend when it is another Redis, as Celery will.

    Raises:
        BrokerRefused: If either refused the user or password (wrong, missing, or a
            disabled user) or the database number.
    """
    where = {settings.broker_url: "ACTONCE_BROKER_URL (or REDIS_URL)"}
    if settings.results_url not in where and settings.results_url.startswith(
        ("redis://", "rediss://", "unix://")
    ):
        where[settings.results_url] = "ACTONCE_RESULT_BACKEND_URL"
    for url, variable in where.items():
        refused = _refused(url)
        if refused is not None:
            raise BrokerRefused(
                f"the Redis at {mask_url(url)} refused actonce's connection ({refused}): "
                f"set a user, password and database it knows in {variable}"
            )


def _refused(url: str) -> str | None:
    """Return why the Redis at `url` refused a connection's handshake, or None if it took it or
    did not answer."""
    client = redis.Redis.from_url(
        url, socket_connect_timeout=CHECK_TIMEOUT_S, socket_timeout=CHECK_TIMEOUT_S
    )
    # The handshake alone (`AUTH`, `SELECT`), no command: a user need not be allowed `PING`.
    pool = client.connection_pool
    try:
        pool.release(pool.get_connection())
    except (AuthenticationError, ResponseError) as refused:
        return reason(refused)
    except RedisError:
        return None  # away, or slow: the worker's retries and the dispatcher's back-off wait
    finally:
        client.close()
    return None
