"""Whether an error that escaped a task's bookkeeping is a store that went away for a while.

reflexr's executor catches what an action raises; what escapes `Reactor.execute` comes from its
own transactions and leases, and from the pool's dead-letter writes. When the database crashes,
restarts or drops a connection, those fail with a connection error (asyncpg's, wrapped by
SQLAlchemy and sometimes by a `TaskGroup`) or an `OSError` from the socket. The attempt's outcome
may already be committed: a task that failed on such an error would leave a dead run without its
dead letter, since nothing sends a finished run again. The task retries instead, and so does the
turn task, whose request would otherwise wait for the dispatcher's sweep with a FAILURE shown.
"""

import logging
from collections.abc import Iterator
from typing import Any, Final

from celery import Task
from celery.exceptions import Retry
from sqlalchemy.exc import DBAPIError, OperationalError

from actonce.tasks.lifecycle import store_outage_retry_s

OUTAGE_SQLSTATES: Final = frozenset({"57P01", "57P02", "57P03"})
"""PostgreSQL's admin shutdown, crash shutdown and "cannot connect now" (starting up), besides
every connection exception (class 08)."""


def is_store_outage(error: BaseException) -> bool:
    """Return whether `error`, or an error it wraps, says a store's connection went away."""
    for cause in _chain(error):
        if isinstance(cause, OSError | OperationalError):
            return True
        if isinstance(cause, DBAPIError) and cause.connection_invalidated:
            return True
        state = getattr(cause, "sqlstate", None)
        if isinstance(state, str) and (state.startswith("08") or state in OUTAGE_SQLSTATES):
            return True
    return False


def retry_through(task: Task[Any, Any], error: Exception, log: logging.Logger, what: str) -> Retry:
    """Send `task`'s retry for a store's outage, log it as `what`, and return it to raise.

    Raises:
        Exception: `error` itself, if it is not a store's outage.
    """
    if not is_store_outage(error):
        raise error
    countdown = store_outage_retry_s(task.request.retries)
    # The error's type only: its text may quote a statement's parameters' values.
    log.warning(
        "%s task_id=%s: a store went away (%s); retrying in %ss",
        what,
        task.request.id,
        type(error).__name__,
        countdown,
    )
    return task.retry(countdown=countdown, max_retries=None, throw=False)


def _chain(error: BaseException) -> Iterator[BaseException]:
    """`error` and what it wraps: causes, contexts, a DBAPI error's original, a group's members."""
    seen: set[int] = set()
    waiting = [error]
    while waiting:
        current = waiting.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            waiting.extend(current.exceptions)
        original = getattr(current, "orig", None)
        if isinstance(original, BaseException):
            waiting.append(original)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                waiting.append(linked)
