"""Whether the broker takes actonce's user and password: checked once, as a process starts.

redis-py raises a refused login as a kind of lost connection, and Celery retries a lost
connection `ACTONCE_BROKER_MAX_RETRIES` times, 2 to 30 s apart: a worker started with a wrong
password logged the same line for about 45 minutes before its supervisor heard of it. No retry
mends a wrong password, so a worker or dispatcher whose broker refuses its login at start
refuses to start, naming the variable to fix. A broker that does not answer at all is left to the
retries: it may be starting, and they are for that.
"""

import redis
from redis.exceptions import AuthenticationError, RedisError

from actonce.worker.health import reason
from actonce.worker.settings import Settings, mask_url

CHECK_TIMEOUT_S = 5.0
"""How long the check waits for the broker to answer; one that does not is left to Celery."""


class BrokerLoginRefused(RuntimeError):
    """Raised at start when the broker, or a Redis result backend, refuses actonce's login; the
    message is one line, the password masked."""


def check_broker_login(settings: Settings) -> None:
    """Log in to the broker, and to the result backend when it is another Redis, with a `PING`.

    Raises:
        BrokerLoginRefused: If either refused the user or password (wrong, missing, or a
            disabled user).
    """
    where = {settings.broker_url: "ACTONCE_BROKER_URL (or REDIS_URL)"}
    if settings.results_url not in where and settings.results_url.startswith(
        ("redis://", "rediss://", "unix://")
    ):
        where[settings.results_url] = "ACTONCE_RESULT_BACKEND_URL"
    for url, variable in where.items():
        refused = _login_refused(url)
        if refused is not None:
            raise BrokerLoginRefused(
                f"the Redis at {mask_url(url)} refused actonce's login ({refused}): "
                f"set the user and password it knows in {variable}"
            )


def _login_refused(url: str) -> str | None:
    """Return why the Redis at `url` refused the login, or None if it took it or did not answer."""
    client = redis.Redis.from_url(
        url, socket_connect_timeout=CHECK_TIMEOUT_S, socket_timeout=CHECK_TIMEOUT_S
    )
    try:
        client.ping()
    except AuthenticationError as refused:
        return reason(refused)
    except RedisError:
        return None  # away, or slow: the worker's retries and the dispatcher's back-off wait
    finally:
        client.close()
    return None
