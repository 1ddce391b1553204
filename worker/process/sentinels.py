"""A `sentinel://` broker URL: the Redis Sentinels it names, and the master they name now.

The URL is kombu's and Celery's, `sentinel://[USER:PASSWORD@]HOST:PORT;sentinel://HOST:PORT;…`:
each `;`-separated part is a sentinel, and the user, password and database number belong to the
master (the sentinels' own password is a setting of its own). kombu reads the database and
credentials off the first part only and Celery's result backend off the first too, so a URL that
gives them on the last part alone (`…;sentinel://HOST:PORT/DB`) would have put the queues in
database 0: `SentinelUrl.for_celery` writes them on every part, so kombu, Celery and actonce's own
clients reach the same database of the same master. A client `master_client` returns asks the
sentinels for the master at each new connection, so it follows a failover without a restart.
"""

from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote, unquote, urlsplit

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

SCHEME: Final = "sentinel"
"""The scheme of a broker URL that names sentinels instead of a Redis."""

DEFAULT_PORT: Final = 26379
"""A sentinel's port when its part of the URL gives none (Redis Sentinel's own default)."""

FORM: Final = "sentinel://[USER:PASSWORD@]HOST:PORT;sentinel://HOST:PORT;.../DB"
"""The form a sentinel URL takes, for error messages."""


@dataclass(frozen=True)
class SentinelUrl:
    """What a `sentinel://` URL says: the sentinels, and the master's database and credentials."""

    sentinels: tuple[tuple[str, int], ...]
    """Each sentinel's host and port, in the URL's order."""

    db: int
    """The master's database number."""

    username: str | None
    """The master's user, if the URL names one."""

    password: str | None
    """The master's password, if the URL gives one."""

    def for_celery(self) -> str:
        """Return the URL with the credentials and database on every part, as kombu and Celery
        read them off the first."""
        auth = ""
        if self.username or self.password:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password or '', safe='')}@"
        return ";".join(
            f"{SCHEME}://{auth}{host}:{port}/{self.db}" for host, port in self.sentinels
        )


def is_sentinel(url: str) -> bool:
    """Whether `url` names Redis Sentinels rather than a Redis."""
    return url.lower().startswith(f"{SCHEME}://")


def parse(url: str) -> SentinelUrl:
    """Return what the sentinel URL `url` says.

    The database and credentials may be given on any part, but must agree where more than one
    gives them.

    Raises:
        ValueError: If a part is not `sentinel://HOST[:PORT][/DB]`, or the parts disagree; the
            message never quotes a password.
    """
    sentinels = []
    dbs: set[int] = set()
    credentials: set[tuple[str | None, str | None]] = set()
    for number, part in enumerate(url.split(";"), start=1):
        try:
            split = urlsplit(part.strip())
            port = split.port or DEFAULT_PORT
        except ValueError:
            raise ValueError(f"part {number} has no valid port; the form is {FORM}") from None
        if split.scheme.lower() != SCHEME or not split.hostname:
            raise ValueError(f"part {number} is not sentinel://HOST:PORT; the form is {FORM}")
        sentinels.append((split.hostname, port))
        path = split.path.strip("/")
        if path:
            if not path.isdigit():
                raise ValueError(f"part {number}'s database is not a number; the form is {FORM}")
            dbs.add(int(path))
        if split.username or split.password:
            credentials.add(
                (
                    unquote(split.username) if split.username else None,
                    unquote(split.password) if split.password else None,
                )
            )
    if len(dbs) > 1 or len(credentials) > 1:
        raise ValueError(
            "the parts give different databases or passwords; give them once, the same for "
            f"all: {FORM}"
        )
    username, password = credentials.pop() if credentials else (None, None)
    return SentinelUrl(tuple(sentinels), dbs.pop() if dbs else 0, username, password)


def master_client(
    url: str, master_name: str, sentinel_password: str | None, **options: Any
) -> "redis.Redis":
    """Return a client of the master the sentinels at `url` name `master_name`.

    The client asks the sentinels where the master is each time it opens a connection, and drops
    its connections when the answer changes, so after a failover its next command reaches the
    new master. `options` are redis-py's connection options (timeouts, `retry`): they apply to
    the master's connections, and its socket timeouts to the sentinels' too.
    """
    place = parse(url)
    sentinel_options: dict[str, Any] = {
        name: value for name, value in options.items() if name.startswith("socket_")
    }
    if sentinel_password:
        sentinel_options["password"] = sentinel_password
    sentinel = Sentinel(list(place.sentinels), sentinel_kwargs=sentinel_options)
    client: redis.Redis = sentinel.master_for(
        master_name,
        db=place.db,
        username=place.username,
        password=place.password,
        **options,
    )
    return client


def master_address(client: "redis.Redis") -> str | None:
    """Return `HOST:PORT` of the master a `master_client` reaches now (asking the sentinels);
    None for a client of a plain Redis URL.

    Raises:
        redis.RedisError: If no sentinel answers or none knows the master.
    """
    pool = client.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return None
    host, port = pool.get_master_address()  # type: ignore[no-untyped-call]
    return f"{host}:{port}"
